"""portal.serve runs Daphne with the cyclic collector's young generation collected far less often
than CPython's default (the agents' messages leave cyclic garbage; see GC_YOUNG_THRESHOLD)."""

from __future__ import annotations

import gc

import pytest

from portal import serve


@pytest.fixture
def restore_gc_threshold():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_daphne_runs_with_the_raised_young_threshold(monkeypatch, restore_gc_threshold):
    gc.set_threshold(700, 10, 10)
    seen = []
    monkeypatch.setattr(serve.CommandLineInterface, "run", lambda self, args: seen.append(gc.get_threshold()))
    monkeypatch.setattr(serve.sys, "argv", ["portal.serve", "-b", "127.0.0.1", "portal.asgi:application"])
    monkeypatch.setattr(serve.daphne.server, "WebSocketFactory", serve.daphne.server.WebSocketFactory)
    serve.main()
    assert seen == [(serve.GC_YOUNG_THRESHOLD, 10, 10)]
    assert serve.GC_YOUNG_THRESHOLD > 700
