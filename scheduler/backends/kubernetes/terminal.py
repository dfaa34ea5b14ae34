"""A shell in a pod through the exec subresource (`kubernetes.stream.stream` on
`connect_get_namespaced_pod_exec`, protocol v4.channel.k8s.io): stdin on channel 0, the TTY's
output on 1 (a TTY merges stderr into it), the exit status on 3, the window size on 4 as kubectl
sends it ({"Width": cols, "Height": rows})."""

from __future__ import annotations

import json
import threading

from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream
from kubernetes.stream.ws_client import RESIZE_CHANNEL, STDIN_CHANNEL

from ..base import PermanentBackendError, PodRef, TransientBackendError

# bash when the image has it, sh otherwise; a login shell, as `kubectl exec -it` users expect.
SHELL = ("/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi")


def exec_arguments(ref: PodRef) -> dict:
    """The keywords of `stream(core.connect_get_namespaced_pod_exec, **…)` for an interactive shell."""
    return {"name": ref.name, "namespace": ref.namespace, "command": list(SHELL), "stdin": True, "stdout": True,
            "stderr": True, "tty": True, "_preload_content": False, "binary": True}


def resize_message(rows: int, cols: int) -> bytes:
    return json.dumps({"Width": cols, "Height": rows}, separators=(",", ":")).encode()


class ExecTerminal:
    """The `scheduler.backends.base.Terminal` contract over one exec WebSocket."""

    def __init__(self, ws) -> None:
        self._ws = ws
        self._pending = b""
        self._read_lock = threading.Lock()

    def read(self, max_bytes: int, timeout_s: float) -> bytes | None:
        with self._read_lock:
            if not self._pending:
                self._ws.update(timeout=timeout_s)
                # The client's read_all(): stdout and stderr as they came, and its buffers emptied
                # (else it keeps a copy of every byte of a long session).
                data = self._ws.read_all()
                self._pending = data.encode() if isinstance(data, str) else data
            if not self._pending:
                return None if self._ws.is_open() else b""
            data, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
            return data

    def write(self, data: bytes) -> None:
        if self._ws.is_open():
            self._ws.write_channel(STDIN_CHANNEL, bytes(data))

    def resize(self, rows: int, cols: int) -> None:
        if self._ws.is_open():
            self._ws.write_channel(RESIZE_CHANNEL, resize_message(rows, cols))

    def close(self) -> None:
        self._ws.close()


def open_exec_terminal(core, ref: PodRef, rows: int, cols: int) -> ExecTerminal:
    """`core`: a CoreV1Api. The stream helper reports every failure as an ApiException with status
    0 and the handshake's answer in its reason."""
    what = f"terminal in pod {ref.namespace}/{ref.name}"
    try:
        ws = stream(core.connect_get_namespaced_pod_exec, **exec_arguments(ref))
    except ApiException as exc:
        text = f"{exc.status or ''} {exc.reason or ''}".strip()
        if exc.status == 404 or " 404 " in f" {text} ":
            raise PermanentBackendError(f"{what}: the pod does not exist") from exc
        if exc.status in (400, 403) or any(f" {code} " in f" {text} " for code in ("400", "403")):
            raise PermanentBackendError(f"{what}: refused ({text})") from exc
        raise TransientBackendError(f"{what}: {text}") from exc
    terminal = ExecTerminal(ws)
    terminal.resize(rows, cols)
    return terminal
