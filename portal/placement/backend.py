"""The cluster backend this process acts through, built once per process from the settings.

TESSERA_BACKEND=local: simulated cluster whose state file (TESSERA_LOCAL_STATE) web, workers and
beat share; its nodes are the database's nodes. TESSERA_BACKEND=kubernetes:
`scheduler.backends.kubernetes`, pods in TESSERA_NAMESPACE with TESSERA_RUNTIME_CLASS and their
share through TESSERA_KUBERNETES_SHARING, kubectl pods of TESSERA_SCHEDULER_NAMES. (All read in settings.py.)
"""

from __future__ import annotations

import os
import time

from django.conf import settings

from portal.fleet.models import Node
from scheduler.backends import Backend, create

_cache: dict[tuple, Backend] = {}
_known_nodes: dict[tuple, frozenset[str]] = {}
_nodes_checked: dict[tuple, float] = {}
NODES_EVERY_S = 5.0  # how often the simulated cluster looks for new nodes in the database


def _key() -> tuple:
    """This process's backend for the current settings (a forked worker builds its own)."""
    name = settings.TESSERA_BACKEND
    if name == "local":
        return (os.getpid(), name, settings.TESSERA_LOCAL_STATE, float(settings.TESSERA_LOCAL_START_S))
    return (os.getpid(), name, settings.TESSERA_NAMESPACE, settings.TESSERA_KUBERNETES_SHARING)


def get_backend() -> Backend:
    name = settings.TESSERA_BACKEND
    key = _key()
    if name == "local":
        state, start = settings.TESSERA_LOCAL_STATE, float(settings.TESSERA_LOCAL_START_S)
        backend = _cache.get(key)
        if backend is None:
            backend = _cache[key] = create("local", state_path=state, start_delay_s=start)
        # Nodes come and go with the inventory; the simulated cluster follows the database.
        if key not in _known_nodes or time.monotonic() - _nodes_checked.get(key, 0.0) > NODES_EVERY_S:
            nodes = frozenset(Node.objects.values_list("name", flat=True))
            if _known_nodes.get(key) != nodes:
                backend.add_nodes(sorted(nodes - _known_nodes.get(key, frozenset())))
                _known_nodes[key] = nodes
            _nodes_checked[key] = time.monotonic()
        return backend
    if key not in _cache:
        _cache[key] = create(name, namespace=settings.TESSERA_NAMESPACE, runtime_class=settings.TESSERA_RUNTIME_CLASS,
                             scheduler_names=settings.TESSERA_SCHEDULER_NAMES,
                             sharing=settings.TESSERA_KUBERNETES_SHARING)
    return _cache[key]


def use_backend(backend: Backend) -> None:
    """Act through `backend` for the current settings until `forget_backends`: for callers that
    build it with options the settings do not carry (short retries in tests, benchmarks)."""
    key = _key()
    _cache[key] = backend
    # A new cluster has none of the database's nodes yet: get_backend adds them on its next call,
    # even where an earlier backend of the same settings had them (tests switching clusters).
    _known_nodes.pop(key, None)
    _nodes_checked.pop(key, None)


def forget_backends() -> None:
    """Close and drop this process's backends (tests and benchmarks that switch clusters)."""
    for backend in _cache.values():
        close = getattr(backend, "close", None)
        if close is not None:
            close()
    _cache.clear()
    _known_nodes.clear()
    _nodes_checked.clear()
