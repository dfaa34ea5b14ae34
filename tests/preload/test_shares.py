"""Compute shares on the fake device, measured over 20 s.

All mixes run at once, each on its own fake GPU (kernels of one fake GPU run one at a time across
processes; a kernel sleeps for its duration, so the measurement does not depend on free CPU), with
one broker serving every GPU, as on a node. Fractions are of wall time: device time a process got
divided by the length of the common measurement interval.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import pytest

from tests.agents.broker.process import BrokerProcess

from .conftest import LIBRARY, Env, fake_env

SECONDS = 20.0
KERNEL_US = 1000
TOLERANCE = 0.03

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Job:
    gpu: str
    name: str
    request: float
    limit: float
    priority: str = "low"
    burst: int = 0  # kernels per burst; 0 = always busy
    pause_ms: int = 0
    broker: bool = True
    kernel_us: int = KERNEL_US


JOBS = [
    Job("mix-30-70", "a", 0.3, 1.0),
    Job("mix-30-70", "b", 0.7, 1.0),
    Job("mix-10-90", "a", 0.1, 0.1),
    Job("mix-10-90", "b", 0.9, 0.9),
    Job("lone", "a", 0.3, 1.0),
    Job("capped", "a", 0.5, 0.5),
    # kernels longer than the token thread's idle check: the launcher waits on the GPU between launches
    Job("long-kernels", "a", 0.5, 0.5, kernel_us=30000),
    Job("three", "a", 0.2, 0.4),
    Job("three", "b", 0.3, 0.3),
    Job("three", "c", 0.1, 1.0),
    Job("prio", "high", 0.5, 1.0, "high", burst=100, pause_ms=100),
    Job("prio", "low", 0.5, 1.0, "low"),
    Job("prio-alone", "high", 0.5, 1.0, "high", burst=100, pause_ms=100),
    Job("local", "a", 0.3, 1.0, broker=False),
]


# A measurement during which the hypervisor took more than this share of the CPU time (steal, in
# /proc/stat) says more about the host than about the library: every token hand-off waits for a
# process to be scheduled. It is repeated, at most MEASUREMENTS times in all, and the least
# disturbed one is judged.
STEAL_LIMIT = 0.05
MEASUREMENTS = 3


def _cpu_times() -> tuple[int, int]:
    """(steal, total) jiffies of the whole machine so far."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    steal = fields[7] if len(fields) > 7 else 0
    return steal, sum(fields[:8])


def _measure(root) -> dict[tuple[str, str], dict]:
    broker = BrokerProcess(root / "broker.sock", root / "broker.log").start()
    for job in JOBS:  # the terms as the node's agent gives them; the processes announce the same
        if job.broker:
            broker.define(f"{job.gpu}-{job.name}", job.gpu, job.request, job.limit, job.priority)
    start_at = time.time() + 2.0
    procs = []
    try:
        for job in JOBS:
            env = Env(root, fake_env(root)).with_(
                LD_PRELOAD=str(LIBRARY),
                FAKE_GPU_UUID=job.gpu,
                NVIDIA_VISIBLE_DEVICES=job.gpu,
                TESSERA_SHARE_ID=f"{job.gpu}-{job.name}",
                TESSERA_GPU_REQUEST=str(job.request),
                TESSERA_GPU_LIMIT=str(job.limit),
                TESSERA_PRIORITY=job.priority,
                TESSERA_BROKER_SOCKET=str(broker.socket_path if job.broker else root / "absent.sock"),
            )
            args = ["--seconds", SECONDS, "--kernel-us", job.kernel_us, "--start-at", f"{start_at:.6f}"]
            if job.burst:
                args += ["--burst", job.burst, "--pause-ms", job.pause_ms]
            procs.append((job, env.popen("kernel_loop", *args)))
        out = {}
        for job, proc in procs:
            stdout, stderr = proc.communicate(timeout=SECONDS + 60)
            assert proc.returncode == 0, stderr
            out[(job.gpu, job.name)] = json.loads(stdout) | {"stderr": stderr}
        out[("broker", "stats")] = broker.query()
        return out
    finally:
        for _, proc in procs:
            if proc.poll() is None:
                proc.kill()
        broker.stop()


@pytest.fixture(scope="module")
def results(built, tmp_path_factory) -> dict[tuple[str, str], dict]:
    best = None
    for attempt in range(1, MEASUREMENTS + 1):
        steal_before, total_before = _cpu_times()
        out = _measure(tmp_path_factory.mktemp(f"shares-{attempt}"))
        steal_after, total_after = _cpu_times()
        steal = (steal_after - steal_before) / max(1, total_after - total_before)
        out[("host", "steal")] = {"fraction": steal, "measurement": attempt}
        if best is None or steal < best[("host", "steal")]["fraction"]:
            best = out
        if steal <= STEAL_LIMIT:
            break
        print(f"the host took {steal:.0%} of the CPU time during measurement {attempt}")
    return best  # the one the host disturbed least


def fraction(results, gpu: str, name: str) -> float:
    r = results[(gpu, name)]
    return r["busy_s"] / r["wall_s"]


# If even the least disturbed measurement lost more than this to the hypervisor, token hand-offs took
# milliseconds and the fake GPUs sat idle between holders for reasons outside the library: the
# absolute fractions cannot be judged. What steal cannot explain still is: how the busy time was
# split, that no share passed its limit, priority, the broker's accounting.
UNMEASURABLE_STEAL = 0.10


def host_disturbed(results) -> float | None:
    steal = results[("host", "steal")]["fraction"]
    return steal if steal > UNMEASURABLE_STEAL else None


def skip_if_disturbed(results) -> None:
    if steal := host_disturbed(results):
        pytest.skip(f"the host took {steal:.0%} of the CPU time in the least disturbed of {MEASUREMENTS} "
                    "measurements: absolute device-time fractions cannot be judged on this machine now")


@pytest.mark.parametrize(("gpu", "expected", "limits"),
                         [("mix-30-70", (0.3, 0.7), (1.0, 1.0)), ("mix-10-90", (0.1, 0.9), (0.1, 0.9))])
def test_two_shares_get_their_fractions(results, gpu: str, expected: tuple[float, float],
                                        limits: tuple[float, float]) -> None:
    got = (fraction(results, gpu, "a"), fraction(results, gpu, "b"))
    assert got[0] <= limits[0] + TOLERANCE and got[1] <= limits[1] + TOLERANCE, got
    # the busy time is split as the requests say, however much the host left idle
    assert got[0] / sum(got) == pytest.approx(expected[0] / sum(expected), abs=TOLERANCE), got
    skip_if_disturbed(results)
    assert got[0] == pytest.approx(expected[0], abs=TOLERANCE), got
    assert got[1] == pytest.approx(expected[1], abs=TOLERANCE), got


def test_a_lone_share_bursts_to_the_whole_device(results) -> None:
    skip_if_disturbed(results)
    assert fraction(results, "lone", "a") >= 0.95


def test_a_share_never_passes_its_limit_even_alone(results) -> None:
    got = fraction(results, "capped", "a")
    assert got <= 0.53, got
    skip_if_disturbed(results)
    assert got >= 0.45, got


def test_long_kernels_are_charged_in_full(results) -> None:
    # a process that waits on its own 30 ms kernels is busy, not idle: its waits must not be taken off
    # what its tokens used (on an H200, graphs of 2 ms got 0.58 of the card at a 0.5 limit that way)
    got = fraction(results, "long-kernels", "a")
    assert got <= 0.53, got
    skip_if_disturbed(results)
    assert got >= 0.45, got


def test_three_tenants_converge(results) -> None:
    got = [fraction(results, "three", n) for n in "abc"]
    # a bursts to its limit 0.4, b is held to 0.3, c (request 0.1, limit 1) takes what is left
    assert got[0] <= 0.4 + TOLERANCE and got[1] <= 0.3 + TOLERANCE, got
    skip_if_disturbed(results)
    assert got[0] == pytest.approx(0.4, abs=TOLERANCE), got
    assert got[1] == pytest.approx(0.3, abs=TOLERANCE), got
    assert got[2] == pytest.approx(0.3, abs=TOLERANCE), got


def test_high_priority_keeps_its_throughput_beside_low_priority(results) -> None:
    alone = results[("prio-alone", "high")]["bursts"]
    shared = results[("prio", "high")]["bursts"]
    assert alone > 50
    assert shared / alone >= 0.95, (shared, alone)
    assert fraction(results, "prio", "low") >= 0.20


def test_without_a_broker_the_request_share_is_enforced_locally(results) -> None:
    r = results[("local", "a")]
    assert r["stderr"].count("unreachable") == 1  # logged once, not per token
    assert fraction(results, "local", "a") <= 0.3 + TOLERANCE
    skip_if_disturbed(results)
    assert fraction(results, "local", "a") == pytest.approx(0.3, abs=TOLERANCE)


def test_the_broker_reports_gpu_time_per_share(results) -> None:
    stats = results[("broker", "stats")]["gpus"]
    reported = stats["mix-30-70"]["shares"]["mix-30-70-b"]["used_total_s"]
    measured = results[("mix-30-70", "b")]["busy_s"]
    # the broker counts from the first token to the last, a bit more than the measured interval
    assert measured * 0.97 <= reported <= measured * 1.15
