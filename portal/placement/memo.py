"""Remember which pending reservations the last full look could not place, and skip them while
nothing has freed capacity since (kube-scheduler's "unschedulable queue", simplified).

Placing more only takes capacity away, so a request that did not fit still does not fit until
something frees capacity or changes the rules: a reservation stops holding GPUs, a node or GPU
changes, a team's quota, the quota tree or a team's policy changes. The one writer of each of
those rows says so after its commit, `cycle_requests.request_cycle(..., freed=True)`
(reservation services, fleet services and links, tenancy quotas, departments and policy), and
the placement app bumps a capacity epoch on it (apps.py): one mechanism, explicit, so a bulk
write or an `.update()` inside a service is covered as well as a `save()`. A memo from an older
epoch is ignored, and so is one older than MAX_AGE_S: time alone changes what fits (the
minimum run before a share may be evicted, the eviction cap's window, a booking's lead time),
and a row changed outside the services (the Django admin, a shell) sends no notice.
Only with Redis (`cluster_lock().shared`): without it each process would see only its own
bumps, so every cycle looks at everything.
"""

from __future__ import annotations

import json
import time

from .locking import cluster_lock

EPOCH_KEY = "tessera:placement:capacity-epoch"
MEMO_KEY = "tessera:placement:unschedulable"
MAX_AGE_S = 300.0  # a full look at a long queue costs seconds: not more often than this


def _client():
    return cluster_lock().shared


def bump() -> None:
    """Capacity may have been freed: the next cycle looks at every pending reservation again."""
    client = _client()
    if client is not None:
        client.incr(EPOCH_KEY)


def load() -> tuple[int | None, set[str], float]:
    """(epoch now, reservation ids safe to skip, when the memo's full look was taken)."""
    client = _client()
    if client is None:
        return None, set(), time.time()
    epoch = int(client.get(EPOCH_KEY) or 0)
    raw = client.get(MEMO_KEY)
    if raw:
        memo = json.loads(raw)
        if memo["epoch"] == epoch and time.time() - memo["at"] < MAX_AGE_S:
            return epoch, set(memo["ids"]), memo["at"]
    return epoch, set(), time.time()


def save(epoch: int | None, ids: set[str], at: float) -> None:
    client = _client()
    if client is not None and epoch is not None:
        client.set(MEMO_KEY, json.dumps({"epoch": epoch, "at": at, "ids": sorted(ids)}), ex=int(MAX_AGE_S * 2))
