"""What the kubernetes benchmarks share: the test suite's fake API server, and percentiles."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fake_apiserver_module():
    spec = importlib.util.spec_from_file_location(
        "fake_apiserver", ROOT / "tests" / "scheduler" / "backends" / "fake_apiserver.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fake_apiserver"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


class FakeInProcess:
    """The fake API server in a child process of its own: a benchmark of our client then measures our
    side against the given latency, not the fake's Python work (which, in the same process, holds the
    GIL our client waits for, charging whichever path makes the fake work harder).

    `setup(server, *args)` runs in the child before it serves (its first argument is the started
    server); `ask(fn, *args)` runs `fn(server, *args)` there and answers its (picklable) result."""

    def __init__(self, setup, *args) -> None:
        import multiprocessing

        context = multiprocessing.get_context("fork")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve_fake, args=(child, setup, args), daemon=True)
        self._process.start()
        ok, self.url = self._conn.recv()
        if not ok:
            raise RuntimeError(f"the fake API server did not start: {self.url}")

    def ask(self, fn, *args):
        self._conn.send((fn, args))
        ok, value = self._conn.recv()
        if not ok:
            raise RuntimeError(value)
        return value

    def stop(self) -> None:
        self._conn.send(None)
        self._process.join(10)


def _serve_fake(conn, setup, args) -> None:
    import traceback

    try:
        server = setup(fake_apiserver_module(), *args)
    except Exception:  # told to the parent, which raises it
        conn.send((False, traceback.format_exc()))
        return
    conn.send((True, server.url))
    while (message := conn.recv()) is not None:
        fn, fn_args = message
        try:
            conn.send((True, fn(server, *fn_args)))
        except Exception:
            conn.send((False, traceback.format_exc()))
    server.stop()
