"""Placement pushes leave on the process's sender loop: the caller does not wait for Redis, the
agent's group still gets the message, and a failure is logged, never raised into the commit."""

import asyncio
import contextlib
import logging
import multiprocessing
import threading

import pytest
from channels.layers import get_channel_layer

from portal.reservations.events import allocations_changed
from portal.telemetry.background_sends import BackgroundSender, sender

REDIS_URL = "redis://127.0.0.1:6379/8"  # this module's own Redis database; flushed before and after


@pytest.fixture
def redis_layer(redis_channel_layer):
    redis_channel_layer(REDIS_URL)
    yield get_channel_layer()
    sender.flush(5)  # before the layer goes


def _listen(layer, group: str, ready: threading.Event, got: list, timeout: float = 5.0) -> threading.Thread:
    """A consumer stand-in on its own loop: joins `group`, collects what arrives until `timeout`."""
    async def run() -> None:
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
        ready.set()
        with contextlib.suppress(TimeoutError):
            got.append(await asyncio.wait_for(layer.receive(channel), timeout))

    thread = threading.Thread(target=asyncio.run, args=(run(),))
    thread.start()
    assert ready.wait(5)
    return thread


def test_an_allocation_change_reaches_the_agents_group(redis_layer):
    ready, got = threading.Event(), []
    listener = _listen(redis_layer, "agent.node.42", ready, got)
    allocations_changed.send(sender=None, node_ids=[41, 42])
    listener.join(10)
    assert got == [{"type": "placements.changed"}]


def test_the_caller_does_not_wait_for_the_send():
    local = BackgroundSender()
    release = threading.Event()

    async def slow() -> None:
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 5)

    local.submit(slow, "a slow send")
    # Back here while the send still waits for `release` (it cannot finish before it is set): the
    # caller did not wait for it.
    assert local.flush(0.1) is False
    release.set()
    assert local.flush(5) is True


def test_a_failed_send_is_logged_and_the_next_one_still_goes(caplog):
    local = BackgroundSender()
    done = []

    async def broken() -> None:
        raise ConnectionError("redis went away")

    async def fine() -> None:
        done.append(True)

    with caplog.at_level(logging.ERROR, logger="portal.telemetry.background_sends"):
        local.submit(broken, "placements to node 7")
        local.submit(fine, "placements to node 8")
        assert local.flush(5)
    assert done == [True]
    assert "could not send placements to node 7" in caplog.text
    assert "redis went away" in caplog.text


def test_a_send_that_hangs_is_given_up_and_logged(caplog):
    local = BackgroundSender(timeout_s=0.2)

    async def hangs() -> None:
        await asyncio.Event().wait()

    with caplog.at_level(logging.ERROR, logger="portal.telemetry.background_sends"):
        local.submit(hangs, "placements to node 9")
        assert local.flush(5)  # not stuck behind it
    assert "gave up sending placements to node 9 after 0.2 s" in caplog.text


def _child_sends(local: BackgroundSender, out) -> None:
    async def mark() -> None:
        out.put(threading.current_thread().name)

    local.submit(mark, "from the child")
    out.put("flushed" if local.flush(5) else "timed out")


def test_a_forked_child_gets_its_own_loop():
    """Celery's prefork children inherit the sender but not its thread: they must not hang."""
    local = BackgroundSender()

    async def nothing() -> None:
        return None

    local.submit(nothing, "in the parent")
    assert local.flush(5)
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_child_sends, args=(local, out))
    child.start()
    child.join(20)
    assert child.exitcode == 0
    assert [out.get(timeout=5), out.get(timeout=5)] == ["tessera-channel-sends", "flushed"]
