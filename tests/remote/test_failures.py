"""The programs over loopback and over a veth link between two network namespaces (a GPU host and a
client host): they run unchanged; a server killed mid-copy and a link cut mid-call are CUDA errors in
the client, not hangs; a client killed mid-launch leaves its share whole on the server."""

from __future__ import annotations

import signal
import time

import pytest

from .conftest import DEVICE_UNAVAILABLE, Hosts, MiB, image, parse_kv

SLOW_BUS_US = 60000  # per 4 MiB chunk: a 128 MiB copy takes about 2 s on the fake bus


def test_both_programs_run_over_the_link(hosts: Hosts) -> None:
    cap = 512 * MiB
    client = hosts.client(hosts.gpu.token(memory=cap))
    for program, args in (("drv_prog", [image("fatbin")]), ("rt_prog", [])):
        r = client.run(program, *args, "--bytes", 8 * MiB, "--launches", 3, "--kernel-us", 2000)
        assert r.returncode == 0, f"{program} over {hosts.kind}:\n{r.stdout}{r.stderr}"
        out = parse_kv(r.stdout)
        assert out["copy_ok"] == out["async_copy_ok"] == out["memset_ok"] == "1"
        assert int(out["total"]) == cap
        assert float(out["elapsed_ms"]) >= 5.4


@pytest.mark.parametrize("direction", ["in", "out"])
def test_a_server_killed_mid_copy_is_a_cuda_error_not_a_hang(hosts: Hosts, direction: str) -> None:
    hosts.gpu.stop()
    hosts.gpu.extra_env["FAKE_COPY_DELAY_US"] = str(SLOW_BUS_US)
    hosts.gpu.start()
    client = hosts.client(hosts.gpu.token(memory=512 * MiB))
    proc = client.popen("drv_prog", image("cubin"), "--bytes", 128 * MiB)
    wait_for = "allocated=" if direction == "in" else "copying_out="
    for line in proc.stdout:
        if line.startswith(wait_for):
            break
    time.sleep(0.6)  # well inside the 2 s copy
    killed_at = time.monotonic()
    hosts.gpu.kill()
    stdout, stderr = proc.communicate(timeout=30)
    took = time.monotonic() - killed_at
    out = parse_kv(stdout)
    copy = "cuMemcpyHtoD(a, host, bytes)" if direction == "in" else "cuMemcpyDtoH(back, b, bytes)"
    assert out.get("failed") == copy, stdout + stderr
    assert int(out["error"]) == DEVICE_UNAVAILABLE
    assert "lost the GPU server during cuMemcpy" in stderr
    assert took < 10, f"the client took {took:.1f} s to notice"


def test_a_client_killed_mid_launch_is_cleaned_up(hosts: Hosts) -> None:
    cap = 256 * MiB
    token = hosts.gpu.token(share="res-victim", memory=cap)
    victim = hosts.client(token).popen("drv_prog", image("cubin"), "--bytes", 64 * MiB, "--launches", 1000,
                                       "--kernel-us", 20000)
    for line in victim.stdout:
        if line.startswith("memset_ok"):  # next: a stream, then 1000 launches of 20 ms
            break
    time.sleep(0.5)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    killed_at = time.monotonic()
    while "freed 134217728 bytes the client left allocated" not in hosts.gpu.log and time.monotonic() < killed_at + 30:
        time.sleep(0.1)
    assert "freed 134217728 bytes the client left allocated" in hosts.gpu.log
    # the worker stopped at once: it did not run the launches queued behind the dead client (up to 20 s)
    assert time.monotonic() - killed_at < 12
    r = hosts.client(token).run("drv_prog", image("cubin"), "--bytes", 120 * MiB)
    assert r.returncode == 0, r.stderr
    assert int(parse_kv(r.stdout)["free"]) == cap


def test_a_cut_link_is_a_cuda_error_not_a_hang(built, tmp_path, veth) -> None:
    import secrets

    from .conftest import GpuHost

    gpu = GpuHost(tmp_path, secrets.token_hex(32).encode(), host=veth.gpu_ip, netns=veth.gpu_ns).start()
    hosts = Hosts("veth", gpu, veth)
    try:
        # a 30 s kernel: the client waits for the reply to the event behind it when the link goes
        client = hosts.client(gpu.token(), TESSERA_REMOTE_TIMEOUT_MS="3000")
        proc = client.popen("drv_prog", image("cubin"), "--launches", 1, "--kernel-us", 30_000_000)
        for line in proc.stdout:
            if line.startswith("memset_ok"):
                break
        time.sleep(0.3)
        cut_at = time.monotonic()
        veth.set_up(False)
        stdout, stderr = proc.communicate(timeout=40)
        took = time.monotonic() - cut_at
        out = parse_kv(stdout)
        assert int(out["error"]) == DEVICE_UNAVAILABLE, stdout + stderr
        assert "lost the GPU server" in stderr
        assert took < 15, f"the client took {took:.1f} s to notice"
    finally:
        veth.set_up(True)
        gpu.stop()
