"""`pod_log`: the local backend's simulated log follows the pod's life; the Kubernetes backend reads
the pod's log from the API server (tail and timestamps asked for), None for a pod that is gone."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from scheduler.backends import PodRef, create

from .conftest import spec_for


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def test_local_log_follows_the_simulated_pod():
    clock = Clock()
    backend = create("local", nodes=["gpu-node-1"], start_delay_s=2, clock=clock)
    spec = spec_for()
    backend.bind(spec)
    ref = PodRef(spec.namespace, spec.name)
    assert backend.pod_log(ref).count("\n") == 2  # scheduled, pulling: not started yet
    clock.now += 2 + 180
    log = backend.pod_log(ref)
    assert "started: GPU GPU-0a1b2c3d" in log and "share 0.25" in log and "running for 3 min" in log
    assert all("[simulated]" in line for line in log.splitlines())
    assert len(backend.pod_log(ref, tail_lines=2).splitlines()) == 2
    backend.unbind(ref, 0, "cancelled")
    assert backend.pod_log(ref) is None


def test_kubernetes_reads_the_pod_log():
    asked = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            url = urlparse(self.path)
            asked.append((url.path, parse_qs(url.query)))
            if url.path == "/api/v1/namespaces/tessera/pods/r42-1/log":
                body, code, kind = b"2026-01-01T00:00:00Z epoch 1 loss 0.3\n", 200, "text/plain"
            else:
                body, code, kind = (b'{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound",'
                                    b'"code":404}', 404, "application/json")
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        from scheduler.backends.kubernetes import KubernetesBackend

        backend = KubernetesBackend(host=f"http://127.0.0.1:{server.server_port}",
                                    retry=dict(attempts=1, base_s=0.01, max_s=0.05))
        assert backend.pod_log(PodRef("tessera", "r42-1"), tail_lines=50) == "2026-01-01T00:00:00Z epoch 1 loss 0.3\n"
        assert asked[0][1]["tailLines"] == ["50"] and asked[0][1]["timestamps"][0].lower() == "true"
        assert backend.pod_log(PodRef("tessera", "gone")) is None
        backend.close()
    finally:
        server.shutdown()
