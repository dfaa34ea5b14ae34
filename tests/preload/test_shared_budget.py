"""One memory budget per container: shared by its processes, reclaimed from the dead, race-free."""

from __future__ import annotations

import os
import signal
import struct
import time
from pathlib import Path

from .conftest import Env, GiB, parse_kv

# budget file layout (preload/src/budget.c): header, then 1024 slots of (pid, pad, start time, bytes)
HEADER = struct.Struct("<QII40sQQ")
SLOT = struct.Struct("<iIQQ")


def wait_for_line(proc, prefix: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return line
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"no {prefix!r} from the process: {proc.stderr.read()}")


def test_processes_of_one_container_share_one_budget(capped: Env) -> None:
    env = capped.with_(TESSERA_GPU_MEMORY_LIMIT="1Gi")
    holder = env.popen("hog", GiB * 6 // 10, 1, 30000)
    try:
        assert parse_kv(wait_for_line(holder, "allocated="))["allocated"] == GiB * 6 // 10
        other = env.run("hog", GiB * 6 // 10, 1, 0)
        assert parse_kv(other.stdout) == {"allocated": 0, "last": 2}
        # beside the holder's 0.6 GiB: 3/16 GiB and 1/8 GiB fit; the view shows what both processes hold
        out = parse_kv(env.run("memcap", "dlopen", "alloc", GiB // 4).stdout)
        assert (out["first"], out["second"], out["third"]) == (0, 0, 0)
        assert out["total"] == GiB
        assert out["free"] == GiB - GiB * 6 // 10 - GiB // 4
    finally:
        holder.kill()
        holder.wait()


def test_sigkill_gives_the_memory_back(capped: Env) -> None:
    env = capped.with_(TESSERA_GPU_MEMORY_LIMIT="1Gi")
    holder = env.popen("hog", GiB * 8 // 10, 1, 60000)
    wait_for_line(holder, "allocated=")
    assert parse_kv(env.run("hog", GiB * 8 // 10, 1, 0).stdout)["allocated"] == 0
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert parse_kv(env.run("hog", GiB * 8 // 10, 1, 0).stdout)["allocated"] == GiB * 8 // 10


def test_eight_racing_processes_never_exceed_the_cap(capped: Env) -> None:
    env = capped.with_(TESSERA_GPU_MEMORY_LIMIT="1Gi")
    start = capped.root / "go"
    chunk = GiB // 64
    hogs = [env.popen("hog", chunk, 1000, 3000, start, 2000) for _ in range(8)]
    time.sleep(0.5)  # let all of them reach the start line
    start.touch()
    totals = [parse_kv(wait_for_line(h, "allocated="))["allocated"] for h in hogs]
    for h in hogs:
        h.wait(30)
    assert sum(totals) == GiB  # every chunk that fits was taken, and not one more
    assert sum(1 for t in totals if t) >= 4  # they really raced


def test_fork_child_has_its_own_share_and_returns_it_on_exit(capped: Env) -> None:
    result = capped.with_(TESSERA_GPU_MEMORY_LIMIT="1Gi").run("forker", GiB)
    assert result.returncode == 0, result.stderr
    assert parse_kv(result.stdout) == {"parent_30": 0, "child_30": 0, "child_50": 2, "parent_60": 0}


def test_a_reused_pid_does_not_keep_a_dead_process_bytes(capped: Env) -> None:
    env = capped.with_(TESSERA_GPU_MEMORY_LIMIT="1Gi")
    env.run("hog", 1, 1, 0)  # creates the budget file
    budget = capped.root / "budget"
    data = bytearray(budget.read_bytes())
    magic, version, nslots, mutex, _total, cap = HEADER.unpack_from(data, 0)
    # a slot that claims the whole cap for a pid that is alive (this test) but started at another time:
    # the process it describes is gone and the pid was reused
    SLOT.pack_into(data, HEADER.size, os.getpid(), 0, 1, GiB)
    HEADER.pack_into(data, 0, magic, version, nslots, mutex, GiB, cap)
    budget.write_bytes(bytes(data))
    assert parse_kv(env.run("hog", GiB // 2, 1, 0).stdout)["allocated"] == GiB // 2


def test_a_live_process_keeps_its_bytes(capped: Env) -> None:
    env = capped.with_(TESSERA_GPU_MEMORY_LIMIT="1Gi")
    holder = env.popen("hog", GiB // 2, 1, 30000)
    try:
        wait_for_line(holder, "allocated=")
        stat = Path(f"/proc/{holder.pid}/stat").read_text()
        start = int(stat.rsplit(")", 1)[1].split()[19])
        data = (capped.root / "budget").read_bytes()
        slots = [SLOT.unpack_from(data, HEADER.size + i * SLOT.size) for i in range(8)]
        assert (holder.pid, 0, start, GiB // 2) in slots
        assert parse_kv(env.run("hog", GiB * 6 // 10, 1, 0).stdout)["allocated"] == 0
    finally:
        holder.kill()
        holder.wait()


def test_exec_drops_the_old_image_memory(capped: Env) -> None:
    # exec keeps the pid and start time but destroys the CUDA contexts: the bytes are free again
    result = capped.with_(TESSERA_GPU_MEMORY_LIMIT="1Gi").run("execer", "first", GiB)
    assert parse_kv(result.stdout) == {"before_exec": 0, "after_exec": 0}, result.stderr
