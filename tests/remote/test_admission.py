"""Who gets a worker on a GPU node: only clients with a valid token, each on its token's GPU and no
other, and never blocked by connections that have not authenticated (a hello trickled byte by byte,
many connections from one address or from many)."""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import (
    REMOTE,
    Client,
    GpuHost,
    MiB,
    base_env,
    closed_by_server,
    hello_bytes,
    image,
    parse_kv,
    read_reply,
    signed_claims,
)

WAIT_S = 30  # how long to wait for the server to act; never reached when it works


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    s = socket.socket()
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def _still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        data = sock.recv(1)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)
    return data != b""


@contextlib.contextmanager
def _host(tmp_path: Path, *args: str, **kw) -> Iterator[GpuHost]:
    host = GpuHost(tmp_path, secrets.token_hex(32).encode(), server_args=args, **kw).start()
    try:
        yield host
    finally:
        host.stop()


# ---- the GPUs a node serves ----
def test_the_server_refuses_to_start_without_the_gpus_it_serves(built, tmp_path) -> None:
    (tmp_path / "s").write_text(secrets.token_hex(32))
    r = subprocess.run([str(REMOTE / "tessera-remote-server"), "--listen", "127.0.0.1:0", "--secret-file",
                        str(tmp_path / "s"), "--worker", str(REMOTE / "tessera-remote-worker")],
                       capture_output=True, text=True, env=base_env(), timeout=30)
    assert r.returncode == 2
    assert "no GPU named: pass --gpu UUID for each GPU this node serves" in r.stderr


def _env_dumping_worker(tmp_path: Path) -> Path:
    """A stand-in worker that writes down the environment the server started it with."""
    script = tmp_path / "worker.sh"
    script.write_text(f'#!/bin/sh\nenv > "{tmp_path}/worker-$$.env"\n')
    script.chmod(0o755)
    return script


def _worker_envs(tmp_path: Path) -> list[dict[str, str]]:
    return [parse_kv(p.read_text()) for p in sorted(tmp_path.glob("worker-*.env"))]


def test_each_client_runs_on_its_tokens_gpu_and_sees_no_other(built, tmp_path) -> None:
    gpu_file = tmp_path / "gpus"
    gpu_file.write_text("GPU-bbbb\n\nGPU-cccc\n")  # as agents/remote/gpus.py writes them
    with _host(tmp_path, "--gpu-file", str(gpu_file), gpus=("GPU-aaaa",), worker_bin=_env_dumping_worker(tmp_path),
               preload="") as host:
        for gpu in ("GPU-cccc", "GPU-aaaa"):
            with _connect(host.port) as s:
                s.sendall(hello_bytes(host.token(share=f"res-{gpu}", gpu=gpu)))
                assert closed_by_server(s)  # the stand-in worker exits at once
        with _connect(host.port) as s:
            s.sendall(hello_bytes(host.token(gpu="GPU-dddd")))
            result, why = read_reply(s)
        assert result == 800 and b"names GPU GPU-dddd, which this node does not serve" in why
        deadline = time.monotonic() + WAIT_S
        while len(_worker_envs(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    envs = sorted(_worker_envs(tmp_path), key=lambda e: e["TESSERA_SHARE_ID"])
    assert [(e["TESSERA_SHARE_ID"], e["CUDA_VISIBLE_DEVICES"], e["TESSERA_GPU_UUID"]) for e in envs] == [
        ("res-GPU-aaaa", "GPU-aaaa", "GPU-aaaa"), ("res-GPU-cccc", "GPU-cccc", "GPU-cccc")]
    assert all(e["TESSERA_BUDGET_PATH"] == f"{tmp_path}/tessera-budget-{e['TESSERA_SHARE_ID']}" for e in envs)


def test_a_shares_budget_file_goes_with_its_last_worker(gpu_host: GpuHost) -> None:
    budget = gpu_host.root / "tessera-budget-res-gone"
    with socket.create_connection(("127.0.0.1", gpu_host.port), timeout=30) as s:
        s.sendall(hello_bytes(gpu_host.token(share="res-gone")))
        assert read_reply(s)[0] == 0
        r = Client(gpu_host.address, gpu_host.token(share="res-gone")).run("drv_prog", image("cubin"))
        assert r.returncode == 0, r.stderr
        assert budget.exists()  # the first client's worker still holds it
    deadline = time.monotonic() + WAIT_S
    while budget.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not budget.exists()


def test_a_malformed_gpu_name_stops_the_server(built, tmp_path) -> None:
    (tmp_path / "gpus").write_text("GPU-ok\nGPU bad;rm\n")
    host = GpuHost(tmp_path, secrets.token_hex(32).encode(), server_args=("--gpu-file", str(tmp_path / "gpus")))
    with pytest.raises(RuntimeError, match=r'GPU "GPU bad;rm" is not 1-128 of A-Za-z0-9._:-'):
        host.start()


# ---- the opening: a deadline, and slots only for the authenticated ----
def test_a_trickled_hello_is_cut_at_its_deadline_however_steady_the_trickle(built, tmp_path) -> None:
    with _host(tmp_path, "--hello-timeout-ms", "1500") as host:
        hello = hello_bytes(host.token())
        sent = 0
        with _connect(host.port) as s:
            # a byte every 0.2 s: every single receive is quick, the whole hello would take a minute
            while sent < len(hello):
                try:
                    s.sendall(hello[sent:sent + 1])
                except (ConnectionResetError, BrokenPipeError):
                    break
                sent += 1
                if closed_by_server(s, 0.2):
                    break
        assert sent < len(hello), "the trickled hello was served"
        assert "hello not complete within 1500 ms of the connection" in host.log
        # and the server still serves a client that says its hello at once
        r = Client(host.address, host.token()).run("drv_prog", image("cubin"))
        assert r.returncode == 0, r.stderr


def test_trickling_connections_do_not_take_the_slots_of_authenticated_clients(built, tmp_path) -> None:
    # Twice as many trickling connections as the server has slots for clients, from one address and
    # from several: none of them counts against --max-clients, and a legitimate client is served, even
    # from one of the tricklers' own addresses.
    with _host(tmp_path, "--max-clients", "2") as host:
        tricklers = []
        for i in range(64):
            s = _connect(host.port, source=f"127.0.0.{2 + i % 8}" if i % 2 else "127.0.0.2")
            s.sendall(b"\x01")  # the first byte of a hello, and nothing more
            tricklers.append(s)
        try:
            r = Client(host.address, host.token(memory=64 * MiB)).run("drv_prog", image("cubin"))
            assert r.returncode == 0, r.stderr
            assert int(parse_kv(r.stdout)["total"]) == 64 * MiB
            with _connect(host.port, source="127.0.0.2") as s:
                s.sendall(hello_bytes(host.token()))
                result, _ = read_reply(s)
            assert result == 0
        finally:
            for s in tricklers:
                s.close()


def test_an_address_holds_at_most_its_cap_of_unauthenticated_connections_and_the_oldest_go(built,
                                                                                        tmp_path) -> None:
    with _host(tmp_path, "--max-unauthenticated-per-address", "3") as host:
        neighbour = _connect(host.port, source="127.0.0.4")
        mine = [_connect(host.port, source="127.0.0.3") for _ in range(7)]
        try:
            assert all(closed_by_server(s) for s in mine[:4])  # the four oldest made room
            assert all(_still_open(s) for s in mine[4:])
            assert _still_open(neighbour)  # another address's connection is not theirs to take
            assert "3 from this address already" in host.log
        finally:
            for s in [neighbour, *mine]:
                s.close()


def test_all_unauthenticated_connections_together_are_capped_and_the_oldest_go(built, tmp_path) -> None:
    with _host(tmp_path, "--max-unauthenticated", "4") as host:
        conns = [_connect(host.port, source=f"127.0.0.{10 + i}") for i in range(6)]
        try:
            assert all(closed_by_server(s) for s in conns[:2])
            assert all(_still_open(s) for s in conns[2:])
        finally:
            for s in conns:
                s.close()


# ---- revoked shares (the node agent writes --revoked-file when the portal releases a reservation) ----


def _write_revoked(path: Path, *shares: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{share} {int(time.time())}\n" for share in shares))
    tmp.replace(path)  # as the agent writes it: a new file in one step


def test_a_revoked_share_is_refused_and_its_running_worker_ended(built, tmp_path) -> None:
    revoked = tmp_path / "revoked-shares"
    with _host(tmp_path, "--revoked-file", str(revoked)) as host:
        kept, ended = _connect(host.port), _connect(host.port)
        kept.sendall(hello_bytes(host.token(share="res-kept")))
        ended.sendall(hello_bytes(host.token(share="res-ended")))
        assert read_reply(kept)[0] == 0 and read_reply(ended)[0] == 0  # both have workers
        _write_revoked(revoked, "res-ended")
        assert closed_by_server(ended)  # its worker is killed, though its token has not expired
        assert _still_open(kept)
        with _connect(host.port) as again:
            again.sendall(hello_bytes(host.token(share="res-ended")))
            result, message = read_reply(again)
            assert result != 0 and b"share res-ended was revoked" in message
        with _connect(host.port) as other:
            other.sendall(hello_bytes(host.token(share="res-other")))
            assert read_reply(other)[0] == 0  # other shares are served as before
        kept.close()
        ended.close()
    assert "share res-ended revoked: ending its worker" in host.log


def test_the_server_voids_a_shares_earlier_attempts_and_refuses_tokens_without_one(built, tmp_path) -> None:
    """An entry "<share> <at> <attempt>" voids that share's tokens of earlier attempts only; a token
    of version 1 (no attempt: it could not be revoked per placement) is refused outright."""
    revoked = tmp_path / "revoked-shares"
    revoked.write_text(f"res-a {int(time.time())} 3\n")
    with _host(tmp_path, "--revoked-file", str(revoked)) as host:
        for attempt, served in ((1, False), (2, False), (3, True), (4, True)):
            with _connect(host.port) as s:
                s.sendall(hello_bytes(host.token(share="res-a", attempt=attempt)))
                assert (read_reply(s)[0] == 0) is served, attempt
        v1 = signed_claims(host.secret, f"v=1 share=res-b gpu=GPU-fake-0 mem=0 request=1.0000 limit=1.0000 "
                                        f"priority=normal exp={int(time.time()) + 600}")
        with _connect(host.port) as s:
            s.sendall(hello_bytes(v1))
            result, message = read_reply(s)
            assert result != 0 and b"token version 1 is not supported" in message


def test_what_the_agent_writes_from_the_portals_list_is_what_the_server_refuses(built, tmp_path) -> None:
    """The node agent's side of revocation (agents/remote/revocations.py) against the real server:
    the portal's revoked_shares, written to --revoked-file, ends that share and only that one; a
    later list that voids only its earlier attempts (placed here again) lets its new token in and
    still keeps its old one out."""
    from agents.remote.revocations import RevokedFile
    from wire.agent_portal import PORTAL_MESSAGES, parse

    ended_at = int(time.time())

    def portal_says(*shares: str, from_attempt: int = 2):
        entries = [{"share": s, "at": ended_at, "from_attempt": from_attempt} for s in shares]
        return parse(json.dumps({"v": 1, "type": "revoked_shares", "shares": entries}), PORTAL_MESSAGES)

    path = tmp_path / "revoked-shares"
    agent_file = RevokedFile(path)
    agent_file.write(portal_says())
    with _host(tmp_path, "--revoked-file", str(path)) as host:
        ended, kept = _connect(host.port), _connect(host.port)
        ended.sendall(hello_bytes(host.token(share="812")))
        kept.sendall(hello_bytes(host.token(share="813")))
        assert read_reply(ended)[0] == 0 and read_reply(kept)[0] == 0
        agent_file.write(portal_says("812", "700"))
        assert closed_by_server(ended)
        assert _still_open(kept)
        with _connect(host.port) as again:
            again.sendall(hello_bytes(host.token(share="812")))
            result, message = read_reply(again)
            assert result != 0 and b"share 812 was revoked" in message
        # 812 placed here again, its attempt 2: the portal's list stays the same (812 valid from
        # attempt 2), the new pod's token is served and the old one still refused.
        assert not agent_file.write(portal_says("812", "700", from_attempt=2))
        with _connect(host.port) as back:
            back.sendall(hello_bytes(host.token(share="812", attempt=2)))
            assert read_reply(back)[0] == 0
        with _connect(host.port) as old:
            old.sendall(hello_bytes(host.token(share="812", attempt=1)))
            result, message = read_reply(old)
            assert result != 0 and b"share 812 was revoked (attempt 1)" in message
        kept.close()
        ended.close()
