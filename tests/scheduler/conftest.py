"""Small builders for snapshots, so tests read like the situation they set up."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from scheduler.core import Gpu, Node, NodeStatus, Share


def make_gpu(
    uuid: str,
    index: int = 0,
    model: str = "A100",
    memory_mib: int = 40_000,
    shares: Iterable[Share] = (),
    **kw,
):
    return Gpu(uuid=uuid, index=index, model=model, memory_mib=memory_mib, shares=tuple(shares), **kw)


def make_node(
    name: str,
    gpus: int = 1,
    model: str = "A100",
    memory_mib: int = 40_000,
    status: NodeStatus = NodeStatus.READY,
    shares: dict[int, Iterable[Share]] | None = None,
    **kw,
) -> Node:
    shares = shares or {}
    return Node(
        name=name,
        gpus=tuple(make_gpu(f"{name}-g{i}", i, model, memory_mib, shares.get(i, ())) for i in range(gpus)),
        status=status,
        **kw,
    )


@pytest.fixture
def gpu():
    return make_gpu


@pytest.fixture
def node():
    return make_node
