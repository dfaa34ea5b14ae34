"""GPU room held by claims another scheduler allocated: a pod left to the default kube-scheduler that
names our DeviceClasses gets its claim allocated from our ResourceSlices by the kube-scheduler, not
by our cycle. Housekeeping reads those allocations (`observe`: one list of the claims, through
`KubernetesBackend.foreign_shares`) and

- each cycle's snapshot counts them as shares on their GPUs (`shares_by_gpu`), so our cycle never
  places into room the kube-scheduler already gave away;
- each is charged to the team of the claim's namespace, as a KubeShare-labelled pod there would be
  (`kubectl_labels.team_for_namespace`: `Team.namespace`, else the team whose slug is the
  namespace): the cycle's ledger counts it in that team's quota and fair share, like its
  guaranteed work. A namespace of no team charges nobody (the share still takes its room);
- each is kept as a `ForeignHold` row from the first observation that saw it to the first that did
  not, which the usage reports count as allocated GPU-hours (its team's row, or "unattributed").

Such a share is nobody's reservation: it is marked external (the engine's ClusterState.protected:
never a victim, a booking's included), with the highest priority and a guaranteed admission. What
was last observed stays until the next observation: a cluster that stops answering leaves the room
counted as used, never as free, and its holds open.
"""

from __future__ import annotations

import logging
from decimal import Decimal

from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from portal.fleet.models import Gpu
from portal.tenancy.models import Team
from scheduler import core
from scheduler.backends import Backend, BackendError

from . import fleet_cache
from .kubectl_labels import team_for_namespace
from .models import ForeignHold

log = logging.getLogger(__name__)

CACHE_KEY = "placement:foreign-claims"
PRIORITY = 100  # the highest: never a victim
MILLI = 1000


def teams_of_namespaces(namespaces: set[str]) -> dict[str, Team]:
    """namespace -> its team, by the rule kubectl pods follow (one look-up per namespace: a cluster's
    kube-scheduler claims sit in a few)."""
    found = {ns: team_for_namespace(ns) for ns in namespaces}
    return {ns: team for ns, team in found.items() if team is not None}


def observe(backend: Backend) -> int | None:
    """Read what other schedulers' claims hold now (None: this backend has no DRA, or the read failed
    and the last observation stays)."""
    read = getattr(backend, "foreign_shares", None)
    if read is None:
        return None
    try:
        shares = read()
    except BackendError as exc:
        log.warning("could not read the claims other schedulers allocated (the last ones read still count): %s",
                    exc)
        return None
    teams = teams_of_namespaces({s.claim.split("/", 1)[0] for s in shares})
    slug = {ns: t.slug for ns, t in teams.items()}
    cache.set(CACHE_KEY, [(s.node, s.gpu_index, s.milli, s.memory_mib, s.claim, slug.get(s.claim.split("/", 1)[0], ""))
                          for s in shares], timeout=None)
    _record_holds(shares, teams)
    return len(shares)


def _record_holds(shares, teams: dict[str, Team]) -> None:
    """Open a ForeignHold for each share not held at the last observation, close those gone."""
    now = timezone.now()
    seen = {(s.claim_uid or s.claim, s.node, s.gpu_index): s for s in shares}
    with transaction.atomic():
        open_rows = {(h.claim_uid, h.node_name, h.gpu_index): h.pk
                     for h in ForeignHold.objects.select_for_update().filter(released_at__isnull=True)}
        gone = [pk for key, pk in open_rows.items() if key not in seen]
        if gone:
            ForeignHold.objects.filter(pk__in=gone).update(released_at=now)
        new = [s for key, s in seen.items() if key not in open_rows]
        if not new:
            return
        gpus = {(node, index): pk for pk, node, index in Gpu.objects.filter(
            node__name__in={s.node for s in new}).values_list("pk", "node__name", "index")}
        ForeignHold.objects.bulk_create([ForeignHold(
            claim=s.claim, claim_uid=s.claim_uid or s.claim, namespace=s.claim.split("/", 1)[0],
            team=teams.get(s.claim.split("/", 1)[0]), gpu_id=gpus.get((s.node, s.gpu_index)), node_name=s.node,
            gpu_index=s.gpu_index, gpu_request=Decimal(min(max(s.milli, 1), MILLI)) / MILLI,
            gpu_memory_mib=s.memory_mib, created_at=now) for s in new])


def shares_by_gpu(fleet: fleet_cache.Fleet) -> dict[int, list[core.Share]]:
    """GPU id → the shares other schedulers' claims hold on it, as the engine counts used room (and,
    with a team, that team's use)."""
    observed = cache.get(CACHE_KEY) or []
    if not observed:
        return {}
    gpus = {(node.name, gpu.index): (pk, gpu.memory_mib) for node in fleet.nodes
            for pk, gpu in zip(node.gpu_pks, node.blank.gpus, strict=True)}
    out: dict[int, list[core.Share]] = {}
    for node, index, milli, memory_mib, claim, *team in observed:  # no team: observed before teams were
        if (node, index) not in gpus:
            continue  # a GPU the portal does not know (not in its inventory): not ours to place on
        pk, card_mib = gpus[(node, index)]
        out.setdefault(pk, []).append(core.Share(
            reservation_id=f"claim {claim}", gpu_request=min(1.0, max(milli, 1) / MILLI),
            gpu_memory_mib=min(card_mib, memory_mib) if memory_mib is not None else card_mib,
            priority=PRIORITY, team=team[0] if team else "", admission="guaranteed", external=True))
    return out
