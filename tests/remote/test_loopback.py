"""Remote GPU shares over loopback: a driver-API program and a runtime-API program built with the
installed nvcc run unchanged against a GPU host on the fake driver, under the share's memory cap and
compute share; what a remote share cannot do is refused with a CUDA error and a message; tokens are
checked; the server survives clients that die or misbehave."""

from __future__ import annotations

import os
import signal
import socket
import struct
import time

import pytest

from tests.waiting import wait_for

from .conftest import (
    FAKE,
    NOT_PERMITTED,
    NOT_SUPPORTED,
    PROGS,
    Client,
    GpuHost,
    MiB,
    base_env,
    hello_bytes,
    image,
    parse_kv,
    read_reply,
    start_broker,
)


def check_program_output(out: dict[str, str], cap: int, launches: int, kernel_us: int) -> None:
    assert out.get("done") == "1", out
    assert int(out["total"]) == cap  # memory info shows the share's cap, not the card
    assert int(out["free"]) == cap
    assert out["copy_ok"] == "1"  # host → device → device → host keeps every byte
    assert out["memset_ok"] == "1"
    assert out["async_copy_ok"] == "1"
    # the kernels really ran on the GPU host, one after the other on the stream: the fake kernel
    # sleeps for its first parameter, so the events bracket launches × kernel time
    assert float(out["elapsed_ms"]) >= 0.9 * launches * kernel_us / 1000
    assert int(out["over_cap"]) == 2  # out of memory: over the share's cap
    assert int(out["ipc"]) == NOT_SUPPORTED
    assert int(out["graph"]) == NOT_SUPPORTED
    assert int(out["free_end"]) == cap  # everything freed came back


@pytest.mark.parametrize("kind", ["cubin", "fatbin"])
def test_driver_api_program_runs_on_a_remote_share(gpu_host: GpuHost, kind: str) -> None:
    cap = 256 * MiB
    client = Client(gpu_host.address, gpu_host.token(memory=cap))
    r = client.run("drv_prog", image(kind), "--bytes", 3 * MiB, "--launches", 5, "--kernel-us", 3000,
                   "--over", cap)
    assert r.returncode == 0, r.stdout + r.stderr
    out = parse_kv(r.stdout)
    check_program_output(out, cap, 5, 3000)
    assert int(out["bad_free"]) == 1  # a pointer that is not an allocation: invalid value, no crash
    assert "CUDA IPC handles is not supported on a remote GPU share" in r.stderr
    assert "CUDA graphs is not supported" in r.stderr


def test_runtime_api_program_runs_on_a_remote_share(gpu_host: GpuHost) -> None:
    cap = 192 * MiB
    client = Client(gpu_host.address, gpu_host.token(memory=cap))
    r = client.run("rt_prog", "--bytes", 2 * MiB, "--launches", 4, "--kernel-us", 3000, "--over", cap)
    assert r.returncode == 0, r.stdout + r.stderr
    out = parse_kv(r.stdout)
    check_program_output(out, cap, 4, 3000)
    assert out["devices"] == "1"
    assert out["name"] == "Tessera Fake GPU"
    assert int(out["prop_total"]) == cap
    assert out["last_error"] == "2"  # cudaGetLastError reports the refused cudaMalloc
    assert out["ipc_text"] == "operation not supported on a remote GPU share"
    assert out["host_fn_ok"] == "1"  # ran once the stream's kernels were done
    assert out["pitched_ok"] == "1" and int(out["pitch"]) >= 100
    assert out["ptr_attr_ok"] == "1"


def test_the_same_binaries_run_locally_on_the_fake_driver(built) -> None:
    """The programs are ordinary CUDA programs: with the fake driver's libcuda.so.1 in their path
    they run locally (the card's memory, no cap)."""
    import subprocess

    env = base_env()
    env.update(LD_LIBRARY_PATH=str(FAKE))
    r = subprocess.run([str(PROGS / "drv_prog"), image("cubin"), "--launches", "2", "--kernel-us", "1000"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = parse_kv(r.stdout)
    assert int(out["total"]) == 16 << 30
    assert out["copy_ok"] == "1"


def test_many_threads_share_one_connection(gpu_host: GpuHost) -> None:
    """Eight threads on their own streams copy and launch at once while a ninth asks for memory
    information: the calls take turns on the process's one connection and every thread gets its bytes."""
    cap = 256 * MiB
    r = Client(gpu_host.address, gpu_host.token(memory=cap)).run("mt_prog", image("cubin"), 8, 20)
    assert r.returncode == 0, r.stdout + r.stderr
    out = parse_kv(r.stdout)
    assert out["ok"] == "1"
    assert int(out["free_end"]) == int(out["total"]) == cap
    assert gpu_host.log.count(": share res-1 on GPU") == 1  # one connection, one worker


def test_clients_of_one_share_share_its_memory_cap(gpu_host: GpuHost) -> None:
    cap = 256 * MiB
    token = gpu_host.token(share="res-shared", memory=cap)
    holder = Client(gpu_host.address, token).popen("drv_prog", image("cubin"), "--bytes", 96 * MiB,
                                                   "--hold-ms", 4000)
    try:
        assert holder.stdout.readline().startswith("total=")
        for line in holder.stdout:  # the holder has its 192 MiB now
            if line.startswith("holding="):
                break
        second = Client(gpu_host.address, token).run("drv_prog", image("cubin"), "--bytes", 48 * MiB)
        out = parse_kv(second.stdout)
        assert second.returncode == 1
        assert out["failed"] == "cuMemAlloc(&b, bytes)"  # 192 + 48 fits, 192 + 96 does not
        assert int(out["error"]) == 2
        assert int(out["free"]) == cap - 192 * MiB  # the share's view: what its other process holds is used
        other = Client(gpu_host.address, gpu_host.token(share="res-other", memory=cap))
        assert other.run("drv_prog", image("cubin"), "--bytes", 96 * MiB).returncode == 0  # another share: its own cap
    finally:
        holder.wait(30)
    assert holder.returncode == 0


def test_remote_launches_take_the_share_s_time_from_the_broker(built, tmp_path) -> None:
    import secrets

    broker = start_broker(tmp_path)
    host = GpuHost(tmp_path, secrets.token_hex(32).encode(), broker=broker).start()
    try:
        # the GPU node's agent names the share (the server's workers run in the server's session)
        broker.define("res-timed", "GPU-fake-0", 0.3, 0.3, session=os.getsid(host.proc.pid))
        client = Client(host.address, host.token(share="res-timed", request=0.3, limit=0.3))
        r = client.run("drv_prog", image("cubin"), "--launches", 200, "--kernel-us", 5000)
        assert r.returncode == 0, r.stderr
        elapsed_s = float(parse_kv(r.stdout)["elapsed_ms"]) / 1000

        # The worker reports its last use as it exits, which may come after the client has its
        # answer: wait for the 200 × 5 ms of kernels to be charged rather than read once.
        def charged() -> dict:
            return broker.query()["gpus"]["GPU-fake-0"]["shares"]["res-timed"]

        wait_for(lambda: charged()["used_total_s"] >= 1.0, 30, "the 200 × 5 ms of kernels to be charged", every=0.05)
        share = charged()
        assert share["request"] == pytest.approx(0.3)
        assert share["limit"] == pytest.approx(0.3)
        # each fake kernel sleeps at least its 5 ms (a busy machine only oversleeps), and kernels on
        # one stream run one after another: charged time lies between the work and the run's length
        assert 1.0 <= share["used_total_s"] <= elapsed_s
        # held to 0.3 of the GPU: 1 s of kernels takes about 3 s (less the first window's allowance)
        assert elapsed_s > 1.8
    finally:
        host.stop()
        broker.stop()


# ---- tokens ----
def test_a_token_signed_with_another_secret_is_refused(gpu_host: GpuHost) -> None:
    import secrets

    client = Client(gpu_host.address, gpu_host.token(secret=secrets.token_hex(32).encode()))
    r = client.run("drv_prog", image("cubin"))
    assert r.returncode == 1
    assert int(parse_kv(r.stdout)["error"]) == NOT_PERMITTED
    assert "share token refused: token signature does not match this node's secret" in r.stderr
    assert "refused: token signature does not match" in gpu_host.log


def test_an_expired_or_missing_token_is_refused(gpu_host: GpuHost) -> None:
    from wire.share_tokens import ShareTerms, issue

    expired = issue(gpu_host.secret, ShareTerms("res-1", "GPU-fake-0", MiB, 1, 1), ttl_s=1, now=time.time() - 60)
    r = Client(gpu_host.address, expired).run("rt_prog")
    assert r.returncode == 1
    assert "share token refused: token expired" in r.stderr
    r = Client(gpu_host.address, None).run("rt_prog")
    assert r.returncode == 1
    assert "no share token (TESSERA_REMOTE_TOKEN or TESSERA_REMOTE_TOKEN_FILE" in r.stderr


def test_a_token_for_a_gpu_the_node_does_not_serve_is_refused(built, tmp_path) -> None:
    import secrets

    host = GpuHost(tmp_path, secrets.token_hex(32).encode(), gpus=("GPU-aaaa",)).start()
    try:
        r = Client(host.address, host.token(gpu="GPU-bbbb")).run("drv_prog", image("cubin"))
        assert r.returncode == 1
        assert "share token names GPU GPU-bbbb, which this node does not serve" in r.stderr
    finally:
        host.stop()


def test_no_server_is_a_cuda_error(built) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = Client(f"127.0.0.1:{port}", "tsr1.x.y").run("drv_prog", image("cubin"), timeout=30)
    assert r.returncode == 1
    assert int(parse_kv(r.stdout)["error"]) == 100  # CUDA_ERROR_NO_DEVICE
    assert "cannot reach the GPU server" in r.stderr


# ---- the server survives what clients do ----
def _hello(sock: socket.socket, token: str) -> tuple[int, bytes]:
    sock.sendall(hello_bytes(token))
    return read_reply(sock)


def test_a_client_breaking_the_protocol_is_dropped_and_others_are_served(gpu_host: GpuHost) -> None:
    token = gpu_host.token()
    with socket.create_connection(("127.0.0.1", gpu_host.port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\n\r\n" + b"x" * 64)
        head = s.recv(24)
        assert struct.unpack("<i", head[:4])[0] != 0  # refused with an error reply
    with socket.create_connection(("127.0.0.1", gpu_host.port), timeout=10) as s:
        result, _ = _hello(s, token)
        assert result == 0
        s.sendall(struct.pack("<IIQ", 4, 1 << 30, 0))  # an allocation whose arguments claim 1 GiB
        assert s.recv(1) == b""  # the worker closes the connection
    r = Client(gpu_host.address, token).run("drv_prog", image("cubin"))
    assert r.returncode == 0, r.stderr
    assert "protocol error" in gpu_host.log


def test_a_client_killed_mid_launch_leaves_its_share_whole(gpu_host: GpuHost) -> None:
    cap = 256 * MiB
    token = gpu_host.token(share="res-kill", memory=cap)
    victim = Client(gpu_host.address, token).popen("drv_prog", image("cubin"), "--bytes", 100 * MiB,
                                                   "--launches", 200, "--kernel-us", 20000)
    for line in victim.stdout:
        if line.startswith("memset_ok"):  # next: a stream, then 200 launches of 20 ms
            break
    time.sleep(0.5)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    # the worker notices, frees what the client held and exits; the share's budget is whole again
    wait_for(lambda: "freed 209715200 bytes the client left allocated" in gpu_host.log, 30,
             "the worker to free what the killed client held", every=0.1)
    r = Client(gpu_host.address, token).run("drv_prog", image("cubin"), "--bytes", 120 * MiB)
    assert r.returncode == 0, r.stderr
    assert int(parse_kv(r.stdout)["free"]) == cap
