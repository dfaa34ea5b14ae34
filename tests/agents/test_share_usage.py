"""Per-share GPU time from the real share broker (agents.broker) over its Unix socket."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from pathlib import Path

import pytest

from agents.broker import serve
from agents.gpus.base import ProcessReading, ShareReading
from agents.share_usage import BrokerUsage, with_process_memory

GPU = "GPU-e4ad3e86-d2fd-5887-b483-8cd513bef9e0"


@contextlib.asynccontextmanager
async def broker():
    # A short path: Unix socket paths are limited to about 100 bytes.
    with tempfile.TemporaryDirectory(prefix="tb-") as tmp:
        path = Path(tmp) / "broker.sock"
        ready = asyncio.Event()
        task = asyncio.create_task(serve(path, ready=ready))
        await asyncio.wait_for(ready.wait(), 5)
        try:
            yield path
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
async def test_the_gpu_time_a_share_used_is_read_from_the_broker_and_bounded_by_its_limit():
    async with broker() as path:
        usage = BrokerUsage(path, {GPU})
        worker = asyncio.create_task(busy_process(path, "r-5", 3.0))
        await asyncio.sleep(0.5)
        assert await asyncio.to_thread(usage.read) == []  # the first read is only a baseline
        await asyncio.sleep(2.0)
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
