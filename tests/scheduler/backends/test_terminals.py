"""`Backend.open_terminal`. Local: a real shell on a real PTY with the pod's environment and
nothing of this process's. Kubernetes: what is asked of the exec subresource and what goes over
its channels, through the kubernetes client to a WebSocket server that answers as a kubelet's exec
stream does (the fake API server does not speak exec)."""

from __future__ import annotations

import json
import threading

import pytest

from scheduler.backends.base import Backend, GpuShare, PermanentBackendError, PodRef, make_pod_spec
from scheduler.backends.kubernetes import terminal as k8s_terminal
from scheduler.backends.local import LocalBackend


def _spec(reservation_id: str = "7"):
    return make_pod_spec(reservation_id=reservation_id, attempt=1, namespace="tessera", node="n1", team="vision",
                         image="img", command=(), gpus=(GpuShare("GPU-1", 0, 0.25, 0.5, 4096),), priority=50,
                         kind="interactive")


def _read_until(terminal, needle: bytes) -> bytes:
    seen = b""
    for _ in range(200):  # each read waits at most 0.1 s for output
        data = terminal.read(4096, 0.1)
        assert data != b"", f"the shell ended; it said {seen!r}"
        seen += data or b""
        if needle in seen:
            return seen
    raise AssertionError(f"{needle!r} never came; the shell said {seen!r}")


def test_local_shell_has_the_pods_environment_and_directory(monkeypatch):
    monkeypatch.setenv("SECRET_KEY", "portal-only")
    cluster = LocalBackend(["n1"], start_delay_s=0)
    assert isinstance(cluster, Backend)
    spec = _spec()
    cluster.bind(spec)
    terminal = cluster.open_terminal(spec.ref, 24, 80)
    try:
        terminal.write(b'echo "req=$TESSERA_GPU_REQUEST cap=$TESSERA_GPU_MEMORY_LIMIT key=${SECRET_KEY:-none}"; pwd\n')
        seen = _read_until(terminal, str(cluster.pod_workdir(spec.ref)).encode())
        assert b"req=0.25 cap=4096Mi key=none" in seen
        terminal.resize(33, 101)
        terminal.write(b"stty size\n")
        _read_until(terminal, b"33 101")
    finally:
        terminal.close()
    assert terminal.read(10, 0.1) == b""  # closed: the shell is gone
    cluster.close()


def test_local_terminal_needs_a_running_pod():
    cluster = LocalBackend(["n1"], start_delay_s=3600)
    spec = _spec()
    with pytest.raises(PermanentBackendError, match="does not exist"):
        cluster.open_terminal(spec.ref, 24, 80)
    cluster.bind(spec)
    with pytest.raises(PermanentBackendError, match="is pending, not running"):
        cluster.open_terminal(spec.ref, 24, 80)
    cluster.close()


def test_exec_arguments_ask_for_an_interactive_tty():
    args = k8s_terminal.exec_arguments(PodRef("team-a", "tessera-r7-1"))
    assert args["name"] == "tessera-r7-1" and args["namespace"] == "team-a"
    assert args["tty"] is True and args["stdin"] is True and args["stdout"] is True
    assert args["_preload_content"] is False and args["binary"] is True  # a live stream of bytes
    assert args["command"][:2] == ["/bin/sh", "-c"] and "bash" in args["command"][2]


def test_resize_goes_on_channel_4_as_kubectl_sends_it():
    assert json.loads(k8s_terminal.resize_message(40, 120)) == {"Width": 120, "Height": 40}


class Core:
    def connect_get_namespaced_pod_exec(self, *a, **k):  # never called: the stream is replaced
        raise AssertionError


class ExecServer:
    """The exec subresource's WebSocket as a kubelet answers it (v4.channel.k8s.io: each binary
    message's first byte is its channel): sends `frames` one message each, then records what the
    terminal sends until it has `expect` messages, then sends the exit status and closes. The
    kubernetes client talks to it for real, so a change of the client's stream API fails here."""

    def __init__(self, frames, expect: int) -> None:
        from websockets.sync.server import serve

        self.frames, self.expect = frames, expect
        self.path = ""
        self.received: list[tuple[int, bytes]] = []
        self.server = serve(self._handle, "127.0.0.1", 0, subprotocols=["v4.channel.k8s.io"])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.host = f"http://127.0.0.1:{self.server.socket.getsockname()[1]}"

    def _handle(self, ws) -> None:
        self.path = ws.request.path
        for channel, data in self.frames:
            ws.send(bytes([channel]) + data)
        while len(self.received) < self.expect:
            message = ws.recv(timeout=30)
            self.received.append((message[0], bytes(message[1:])))
        ws.send(b"\x03" + json.dumps({"status": "Success"}).encode())
        ws.close()

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(10)


def _core(host: str):
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = host
    return client.CoreV1Api(client.ApiClient(configuration))


def test_exec_terminal_reads_writes_and_resizes_over_a_real_exec_stream():
    server = ExecServer([(1, b"hello "), (2, b"world"), (1, b"x" * 10)], expect=3)
    try:
        terminal = k8s_terminal.open_exec_terminal(_core(server.host), PodRef("team-a", "p"), 30, 100)
        seen = b""
        while len(seen) < len(b"hello world") + 10:
            data = terminal.read(4, 5.0)
            assert data, f"the stream ended or stalled after {seen!r}"
            assert len(data) <= 4  # a chunk at most as large as asked
            seen += data
        assert seen == b"hello world" + b"x" * 10  # stdout and stderr in the order they came
        assert terminal.read(100, 0.05) is None  # nothing more yet, still open
        terminal.write(b"ls\r")
        terminal.resize(50, 200)
        for _ in range(300):  # until the server's exit status and close end the stream
            if terminal.read(100, 0.1) == b"":
                break
        else:
            raise AssertionError("the exec stream never ended")
        terminal.close()
    finally:
        server.stop()
    assert server.path.startswith("/api/v1/namespaces/team-a/pods/p/exec?")
    assert "tty=True" in server.path and "stdin=True" in server.path
    assert server.received == [(4, b'{"Width":100,"Height":30}'),  # the size first
                               (0, b"ls\r"), (4, b'{"Width":200,"Height":50}')]


def test_exec_refusals_say_what_the_cluster_said(monkeypatch):
    from kubernetes.client.exceptions import ApiException

    from scheduler.backends.base import TransientBackendError

    def refusing(reason):
        def fake_stream(method, **kwargs):
            raise ApiException(status=0, reason=reason)
        return fake_stream

    monkeypatch.setattr(k8s_terminal, "stream", refusing("Handshake status 404 Not Found"))
    with pytest.raises(PermanentBackendError, match="does not exist"):
        k8s_terminal.open_exec_terminal(Core(), PodRef("a", "p"), 24, 80)
    monkeypatch.setattr(k8s_terminal, "stream", refusing("Handshake status 403 Forbidden"))
    with pytest.raises(PermanentBackendError, match="refused"):
        k8s_terminal.open_exec_terminal(Core(), PodRef("a", "p"), 24, 80)
    monkeypatch.setattr(k8s_terminal, "stream", refusing("Connection refused"))
    with pytest.raises(TransientBackendError):
        k8s_terminal.open_exec_terminal(Core(), PodRef("a", "p"), 24, 80)
