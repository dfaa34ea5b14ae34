"""The agent and the real share broker (agents.broker) on its control socket: the agent gives every
share's terms from the portal's placements, and reads per-share GPU time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
from pathlib import Path

import pytest

from agents.broker import Broker, serve
from agents.broker.identity import CgroupIdentity
from agents.broker.protocol import query_stats
from agents.gpus.base import ProcessReading, ShareReading
from agents.placements import PlacementTable
from agents.share_usage import BrokerUsage, with_process_memory
from wire.agent_portal import Placements

GPU = "GPU-e4ad3e86-d2fd-5887-b483-8cd513bef9e0"
POD = "0f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b"


@contextlib.asynccontextmanager
async def broker():
    """The broker in this process, which the kubelet's cgroup layout (under a fixture proc root)
    places in pod POD: processes of this test connect as that pod's."""
    # A short path: Unix socket paths are limited to about 100 bytes.
    with tempfile.TemporaryDirectory(prefix="tb-") as tmp:
        path, control = Path(tmp) / "broker.sock", Path(tmp) / "control.sock"
        proc = Path(tmp) / "proc" / str(os.getpid())
        proc.mkdir(parents=True)
        (proc / "cgroup").write_text(f"11:memory:/kubepods/burstable/pod{POD}/{'c' * 64}\n")
        ready = asyncio.Event()
        task = asyncio.create_task(serve(path, ready=ready, broker=Broker(identity=CgroupIdentity(Path(tmp) / "proc")),
                                         control_path=control))
        await asyncio.wait_for(ready.wait(), 5)
        try:
            yield path, control
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def busy_process(path: Path, share: str, seconds: float) -> None:
    """A workload process that always wants the GPU: it takes every token and uses all of it."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(f"HELLO v=1 share={share} gpu={GPU} pid=4242 request=0.3000 limit=0.5000 "
                 f"priority=normal\n".encode())
    assert (await reader.readline()).startswith(b"OK")
    used_us = 0
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        writer.write(f"ACQUIRE used_us={used_us} idle=0\n".encode())
        grant = (await reader.readline()).decode().split()
        quota_us = int(grant[1].removeprefix("quota_us="))
        started = loop.time()
        await asyncio.sleep(quota_us / 1e6)
        used_us = int((loop.time() - started) * 1e6)
    writer.write(f"RELEASE used_us={used_us} idle=1\n".encode())
    await writer.drain()
    writer.close()


@pytest.mark.asyncio
def placed(*shares: tuple[str, str | None, str]) -> PlacementTable:
    """The portal's placements on GPU: (reservation, pod UID, priority), each request 0.3, limit 0.5."""
    table = PlacementTable({GPU})
    table.apply(Placements.model_validate({"v": 1, "type": "placements", "revision": 1, "placements": [
        {"reservation": r, "gpu_uuid": GPU, "request": 0.3, "limit": 0.5, "memory_mib": None, "pod_uid": pod,
         "priority": priority} for r, pod, priority in shares]}))
    return table


async def hello(path: Path, share: str) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(f"HELLO v=1 share={share} gpu={GPU} pid=1 request=1 limit=1 priority=high\n".encode())
    answer = await reader.readline()
    writer.close()
    return answer


@pytest.mark.asyncio
async def test_the_agent_gives_the_broker_the_placements_terms_and_pods():
    other_pod = "11111111-2222-3333-4444-555555555555"
    async with broker() as (path, control):
        usage = BrokerUsage(control, {GPU}, placements=placed(("r-5", POD, "normal"), ("r-6", other_pod, "high")))
        assert await hello(path, "r-5") == f"ERR refused: share r-5 has no terms on GPU {GPU} (the node agent did " \
                                           "not place it here)\n".encode()
        await asyncio.to_thread(usage.read)  # the agent's first read tells the broker every share's terms
        assert (await hello(path, "r-5")).startswith(b"OK")  # this process is in r-5's pod
        assert (await hello(path, "r-6")).startswith(b"ERR refused: pid")  # ...not in r-6's
        shares = (await asyncio.to_thread(query_stats, control, 5))["gpus"][GPU]["shares"]
    # the terms are the portal's, not what the process claimed (request=1 limit=1 priority=high)
    assert {s: (v["request"], v["limit"], v["priority"]) for s, v in shares.items()} == {
        "r-5": (0.3, 0.5, "low"), "r-6": (0.3, 0.5, "high")}


@pytest.mark.asyncio
async def test_the_gpu_time_a_share_used_is_read_from_the_broker_and_bounded_by_its_limit():
    async with broker() as (path, control):
        usage = BrokerUsage(control, {GPU}, placements=placed(("r-5", POD, "low")))
        assert await asyncio.to_thread(usage.read) == []  # the first read is only a baseline
        worker = asyncio.create_task(busy_process(path, "r-5", 3.0))
        await asyncio.sleep(2.5)
        (reading,) = await asyncio.to_thread(usage.read)
        await worker
    assert (reading.reservation, reading.gpu_uuid) == ("r-5", GPU)
    # The process wanted the whole GPU; the broker held the share near its 0.5 limit.
    assert 0.2 < reading.used_frac <= 0.55


def test_a_missing_broker_means_no_share_readings_and_one_warning(tmp_path, caplog):
    usage = BrokerUsage(tmp_path / "absent.sock", {GPU})
    with caplog.at_level(logging.WARNING):
        assert usage.read() == [] and usage.read() == []
    assert sum("does not answer" in r.message for r in caplog.records) == 1


def test_share_memory_is_what_its_processes_hold_on_that_gpu():
    shares = [ShareReading("r-5", GPU, 0.4, None), ShareReading("r-6", GPU, 0.1, None)]
    procs = [ProcessReading(1, GPU, 1000, 20, reservation="r-5"),
             ProcessReading(2, GPU, 500, 20, reservation="r-5"),
             ProcessReading(3, GPU, 700, 5, reservation=None)]
    filled = with_process_memory(shares, procs)
    assert [(s.reservation, s.mem_used_mib) for s in filled] == [("r-5", 1500), ("r-6", None)]
