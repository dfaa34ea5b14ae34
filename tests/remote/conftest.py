"""Fixtures for the remote GPU share tests: the remote client libraries and server (preload/remote),
test programs built with the installed nvcc, a GPU host on the fake driver with the preload library
and (optionally) the node's share broker, and client hosts in network namespaces joined by a veth link."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import secrets
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agents.broker.protocol import ShareTerms as BrokerTerms
from agents.broker.protocol import query_stats
from tests.agents.broker.process import broker_command, control_path, query_broker
from wire.share_tokens import ShareTerms, issue

REPO = Path(__file__).resolve().parents[2]
PRELOAD = REPO / "preload"
BUILD = PRELOAD / "build"
FAKE = BUILD / "test"
REMOTE = BUILD / "remote"
CLIENT_LIBS = REMOTE / "client"
PROGS = REMOTE / "test"
LIBRARY = BUILD / "libtessera_preload.so"
MiB = 1 << 20
GiB = 1 << 30
DEVICE_UNAVAILABLE = 46  # CUDA_ERROR_DEVICE_UNAVAILABLE: how a lost server shows
NOT_PERMITTED = 800
NOT_SUPPORTED = 801


def make(*targets: str) -> None:
    result = subprocess.run(["make", "-s", "-C", str(PRELOAD), *targets], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"make {' '.join(targets)} failed:\n{result.stdout}\n{result.stderr}")


@pytest.fixture(scope="session")
def built() -> Path:
    nvcc = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
    if not nvcc.exists():
        pytest.skip(f"the test programs are built with nvcc, and {nvcc} is not installed")
    make("remote-test-bins")
    return PROGS


def parse_kv(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.isidentifier():
            out[key] = value
    return out


def base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "FAKE_", "LD_", "CUDA_"))}


@dataclass
class Broker:
    socket_path: Path
    proc: subprocess.Popen

    @property
    def control_path(self) -> Path:
        return control_path(self.socket_path)

    def query(self) -> dict:
        return query_broker(self.control_path)

    def define(self, share: str, gpu: str, request: float, limit: float, session: int) -> None:
        """The share's terms, as the node's agent gives them; its processes are those of ``session``."""
        query_stats(self.control_path, timeout_s=10, terms=[
            BrokerTerms(share=share, gpu=gpu, request=request, limit=limit, priority="low", sessions=[session])])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_broker(root: Path, netns: str | None = None) -> Broker:
    path = root / "broker.sock"
    log = open(root / "broker.log", "ab")  # noqa: SIM115 - kept open by the child
    cmd = [*broker_command(path), "--log-level", "INFO"]
    proc = subprocess.Popen([*ns_prefix(netns), *cmd], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if path.exists():
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
                s.connect(str(control_path(path)))
                return Broker(path, proc)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"broker did not start:\n{(root / 'broker.log').read_text()}")


def ns_prefix(netns: str | None) -> list[str]:
    return ["ip", "netns", "exec", netns] if netns else []


@dataclass
class GpuHost:
    """A GPU node: the remote server on the fake driver, with the preload library in its workers."""

    root: Path
    secret: bytes
    host: str = "127.0.0.1"
    netns: str | None = None
    broker: Broker | None = None
    gpus: tuple[str, ...] = ("GPU-fake-0",)  # the fake driver's one GPU
    server_args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)
    server_bin: Path = REMOTE / "tessera-remote-server"
    worker_bin: Path = REMOTE / "tessera-remote-worker"
    preload: str = str(LIBRARY)
    proc: subprocess.Popen | None = None
    port: int = 0

    def start(self) -> GpuHost:
        secret_file = self.root / "node.secret"
        secret_file.write_bytes(self.secret + b"\n")
        port_file = self.root / "server.port"
        port_file.unlink(missing_ok=True)
        env = base_env()
        env.update(
            LD_LIBRARY_PATH=str(FAKE),
            FAKE_CUDA_STATE_DIR=str(self.root),
            TESSERA_BROKER_SOCKET=str(self.broker.socket_path if self.broker else self.root / "no-broker.sock"),
            **self.extra_env,
        )
        cmd = [str(self.server_bin), "--listen", f"{self.host}:0", "--port-file", str(port_file),
               "--secret-file", str(secret_file), "--worker", str(self.worker_bin),
               "--preload", self.preload, "--budget-dir", str(self.root)]
        for gpu in self.gpus:
            cmd += ["--gpu", gpu]
        cmd += self.server_args
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - kept open by the child
        # its own session, so that "the server was killed" can kill the listener and its workers at once
        self.proc = subprocess.Popen([*ns_prefix(self.netns), *cmd], env=env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if port_file.exists():
                self.port = int(port_file.read_text())
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError(f"remote server did not start:\n{self.log}")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log(self) -> str:
        path = self.root / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def token(self, share: str = "res-1", memory: int = 256 * MiB, request: float = 1.0, limit: float = 1.0,
              gpu: str = "GPU-fake-0", ttl: int = 3600, secret: bytes | None = None, attempt: int = 1) -> str:
        return issue(secret or self.secret, ShareTerms(share, gpu, memory, request, limit, attempt=attempt), ttl_s=ttl)

    def kill(self) -> None:
        """The GPU node's server dies at once: listener and every worker (SIGKILL to its session)."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Client:
    """A process on a node without a GPU: the remote client libraries instead of a driver."""

    server: str
    token: str | None
    netns: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        env = base_env()
        env.update(LD_LIBRARY_PATH=str(CLIENT_LIBS), TESSERA_REMOTE_SERVER=self.server)
        env.update(self.extra_env)
        if self.token is not None:
            env["TESSERA_REMOTE_TOKEN"] = self.token
        return env

    def cmd(self, program: str, *args: object) -> list[str]:
        path = program if "/" in program else str(PROGS / program)
        return [*ns_prefix(self.netns), path, *map(str, args)]

    def run(self, program: str, *args: object, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.cmd(program, *args), env=self.env(), capture_output=True, text=True,
                              timeout=timeout)

    def popen(self, program: str, *args: object) -> subprocess.Popen[str]:
        return subprocess.Popen(self.cmd(program, *args), env=self.env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)


def signed_claims(secret: bytes, claims: str) -> str:
    """A token of any claims text, signed as the portal signs: to try what the portal never issues."""
    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    body = "tsr1." + b64(claims.encode())
    return f"{body}.{b64(hmac.new(secret, body.encode(), hashlib.sha256).digest())}"


def hello_bytes(token: str) -> bytes:
    """A client's opening message (PROTOCOL.md), for tests that speak the protocol themselves."""
    body = struct.pack("<IIII", 0x31525354, 1, len(token), 0) + token.encode()
    return struct.pack("<IIQ", 1, len(body), 0) + body


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the server closed the connection"
        data += chunk
    return data


def read_reply(sock: socket.socket) -> tuple[int, bytes]:
    """A reply's result and its bytes (a refusal's reason, or the results)."""
    result, _deferred, length, _pad, _bulk = struct.unpack("<iiIIQ", recv_exact(sock, 24))
    return result, recv_exact(sock, length)


def closed_by_server(sock: socket.socket, wait_s: float = 30) -> bool:
    """Whether the server closes this connection (end of stream or reset) within wait_s (a bound
    never reached when the server does its job)."""
    sock.settimeout(wait_s)
    try:
        return sock.recv(4096) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def image(kind: str) -> str:
    return str(PROGS / f"kernels.{kind}")


@pytest.fixture
def gpu_host(built: Path, tmp_path: Path) -> Iterator[GpuHost]:
    host = GpuHost(tmp_path, secrets.token_hex(32).encode()).start()
    yield host
    host.stop()


# ---- two hosts from network namespaces ----
@dataclass
class Link:
    gpu_ns: str
    client_ns: str
    gpu_ip: str
    client_ip: str
    gpu_dev: str
    client_dev: str

    def set_up(self, up: bool) -> None:
        """Cut (or restore) the link: the GPU side's end goes down, packets stop, nothing closes."""
        r = _ip("-n", self.gpu_ns, "link", "set", self.gpu_dev, "up" if up else "down")
        assert r.returncode == 0, r.stderr


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture(scope="session")
def veth() -> Iterator[Link]:
    """A GPU host and a client host in their own network namespaces, joined by a veth pair, with
    addresses that exist only inside them."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CI runs the suite as root)")
    tag = f"{os.getpid() % 100000}"
    gpu_ns, client_ns = f"tsr-gpu-{tag}", f"tsr-cli-{tag}"
    link = Link(gpu_ns, client_ns, "10.211.7.1", "10.211.7.2", f"tg{tag}", f"tc{tag}")
    made: list[str] = []
    try:
        for ns in (gpu_ns, client_ns):
            r = _ip("netns", "add", ns)
            if r.returncode != 0:
                pytest.skip(f"cannot create a network namespace here: {r.stderr.strip()}")
            made.append(ns)
        steps = [
            ("link", "add", f"tg{tag}", "type", "veth", "peer", "name", f"tc{tag}"),
            ("link", "set", f"tg{tag}", "netns", gpu_ns),
            ("link", "set", f"tc{tag}", "netns", client_ns),
            ("-n", gpu_ns, "addr", "add", f"{link.gpu_ip}/30", "dev", f"tg{tag}"),
            ("-n", client_ns, "addr", "add", f"{link.client_ip}/30", "dev", f"tc{tag}"),
            ("-n", gpu_ns, "link", "set", f"tg{tag}", "up"),
            ("-n", client_ns, "link", "set", f"tc{tag}", "up"),
            ("-n", gpu_ns, "link", "set", "lo", "up"),
            ("-n", client_ns, "link", "set", "lo", "up"),
        ]
        for step in steps:
            r = _ip(*step)
            if r.returncode != 0:
                pytest.skip(f"cannot build the veth link ({' '.join(step)}): {r.stderr.strip()}")
        yield link
    finally:
        for ns in made:  # deleting a namespace deletes its end of the veth pair, and with it the pair
            _ip("netns", "delete", ns)


@dataclass
class Hosts:
    """A GPU host and a client host, on loopback or on the two ends of the veth link."""

    kind: str
    gpu: GpuHost
    link: Link | None

    def client(self, token: str | None, **env: str) -> Client:
        return Client(self.gpu.address, token, netns=self.link.client_ns if self.link else None, extra_env=env)


@pytest.fixture(params=["loopback", "veth"])
def hosts(request, built: Path, tmp_path: Path) -> Iterator[Hosts]:
    link = request.getfixturevalue("veth") if request.param == "veth" else None
    gpu = GpuHost(tmp_path, secrets.token_hex(32).encode(), host=link.gpu_ip if link else "127.0.0.1",
                  netns=link.gpu_ns if link else None).start()
    yield Hosts(request.param, gpu, link)
    gpu.stop()
