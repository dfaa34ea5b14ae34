"""The demo's node tokens file (`manage.py demo` sets TESSERA_DEMO_TOKENS_FILE for its portal):
a token issued in the portal (the fleet page's "rotate") is written there after commit, and the
simulated fleet reads the file again when it reconnects (agents.fleet.token_in), so rotating a
simulated node's token does not leave it refused, and lost, until the demo restarts. Unset
(every real installation): nothing is written; a real node gets its token from its admin."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import yaml
from django.conf import settings
from django.db import transaction


def remember_after_commit(node_name: str, key: str) -> None:
    path = getattr(settings, "TESSERA_DEMO_TOKENS_FILE", "")
    if path:
        transaction.on_commit(lambda: remember(Path(path), node_name, key))


def remember(path: Path, node_name: str, key: str) -> None:
    """Set the node's token in the file: one whole-file replace under a lock, so the fleet never
    reads half a file and two rotations at once both land."""
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            tokens = yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else {}
        except yaml.YAMLError:
            tokens = {}
        tokens = tokens if isinstance(tokens, dict) else {}
        tokens[node_name] = key
        temp = path.with_name(path.name + ".tmp")
        temp.write_text("".join(f"{name}: {value}\n" for name, value in sorted(tokens.items())), encoding="utf-8")
        temp.chmod(0o600)
        os.replace(temp, path)
