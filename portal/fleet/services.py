"""Fleet operations: drain and return nodes, plan drains (maintenance windows), cordon GPUs, node
agent credentials, loading an inventory, what an agent's hello says of its GPUs, node seen and lost.
Site admins' operations are audited (portal.audit) in the transaction that makes them."""

from __future__ import annotations

import logging
import secrets

from django.db import transaction
from django.utils import timezone

from portal.audit import services as audit
from portal.cycle_requests import request_cycle
from portal.errors import RuleViolation
from portal.tenancy.models import hash_secret
from wire.agent_portal import MAX_GPUS_PER_NODE

from . import demo_tokens
from .drain_plans import Window, describe
from .events import announce_nodes, announce_token_retired
from .models import AWAITING_APPROVAL, DrainState, Gpu, LostCause, Node, NodeStatus, PlannedDrain

log = logging.getLogger(__name__)


SYSTEM = audit.Actor(None)  # who issues a node token when no person does (the demo, agent_tokens)


def _set_status(node_id: int, status: str, reason: str, by: audit.Actor, action: str, message: str = "") -> Node:
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        if node.status != status or node.status_reason != reason:
            before = {"status": node.status, "status_reason": node.status_reason}
            node.status = status
            node.status_reason = reason[:200]
            node.save(update_fields=["status", "status_reason"])
            audit.record(by, object_type="node", object_id=node.pk, object_repr=node.name,
                         action=action, before=before, after={"status": status, "status_reason": node.status_reason},
                         message=message)
            request_cycle(f"node {node.name} {status}", freed=True)
            announce_nodes([node.pk])
    return node


def drain(node_id: int, by: audit.Actor, reason: str = "") -> Node:
    """No new placements on the node; what runs there keeps running. A planned drain holding the
    node now ends: the person's drain stands, and the plan's end will not return the node."""
    with transaction.atomic():
        _end_active_plans(node_id, by, f"drained by hand by {by.label}: the node stays drained until a person "
                          "returns it")
        return _set_status(node_id, NodeStatus.DRAINING, reason or f"drained by {by.label}", by, "drained")


def undrain(node_id: int, by: audit.Actor, reason: str = "") -> Node:
    """The node takes new placements again; a planned drain holding it now ends here (and is not
    started again)."""
    with transaction.atomic():
        _end_active_plans(node_id, by, f"returned to service by hand by {by.label}")
        return _set_status(node_id, NodeStatus.READY, reason, by, "undrained")


# Planned drains. A plan's start drains a ready node (or a lost one, which comes back drained) and
# notes that the plan did (`applied`); its end returns the node only if it is still drained for
# that plan, so a person's drain or return meanwhile stands. Each step is a compare-and-set on the
# plan's state under the node's row lock: a retried or doubled periodic task acts once.


def plan_drain(node_id: int, by: audit.Actor, window: Window, bookings: list[dict] | None = None,
               now=None) -> PlannedDrain:
    """Store a site admin's plan (checked by drain_plans.window_of; the bookings it affects were
    judged by reservations.drain_effects, which calls here). A plan starting now drains the node at
    once. Refuses (RuleViolation) a plan overlapping another open plan of the node."""
    now = now or timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        clash = (PlannedDrain.objects.filter(node=node, state__in=(DrainState.PLANNED, DrainState.ACTIVE))
                 .exclude(ends_at__lte=window.starts_at))
        if window.ends_at is not None:
            clash = clash.filter(starts_at__lt=window.ends_at)
        other = clash.first()
        if other is not None:
            raise RuleViolation({"starts_at": [f"overlaps the drain already planned for this node: "
                                               f"{describe(other, node.name)}; cancel or change that one first"]})
        plan = PlannedDrain.objects.create(node=node, starts_at=window.starts_at, ends_at=window.ends_at,
                                           reason=window.reason, created_by=by.user_obj)
        after = {"plan": plan.pk, "starts_at": plan.starts_at.isoformat(),
                 "ends_at": plan.ends_at.isoformat() if plan.ends_at else None, "reason": plan.reason}
        if bookings:
            after["bookings_affected"] = bookings
        audit.record(by, object_type="node", object_id=node.pk, object_repr=node.name, action="drain planned",
                     after=after, message=describe(plan, node.name)
                     + (f"; {len(bookings)} booking(s) affected, their owners told" if bookings else ""))
        announce_nodes([node.pk])
        if plan.starts_at <= now:
            _start_plan(plan.pk, now)
            plan.refresh_from_db()
    return plan


def cancel_drain(plan_id: int, by: audit.Actor, now=None) -> PlannedDrain:
    """Cancel a plan not started yet, or end one draining the node now (the node is returned if
    the plan drained it and nobody changed it since). Ended or cancelled plans stay as they are."""
    now = now or timezone.now()
    with transaction.atomic():
        plan = PlannedDrain.objects.select_related("node").get(pk=plan_id)
        node = Node.objects.select_for_update().get(pk=plan.node_id)
        plan = PlannedDrain.objects.select_for_update().get(pk=plan_id)
        if plan.state == DrainState.PLANNED:
            _close(plan, DrainState.CANCELLED, f"cancelled by {by.label}", now)
            audit.record(by, object_type="node", object_id=node.pk, object_repr=node.name,
                         action="drain cancelled", before={"plan": plan.pk}, message=describe(plan, node.name))
            announce_nodes([node.pk])
        elif plan.state == DrainState.ACTIVE:
            _finish(plan, node, by, f"ended early by {by.label}", now)
    return plan


def apply_due_drains(now=None) -> tuple[int, int]:
    """Start the plans whose start has come and end those whose end has come (the periodic
    housekeeping, every 10 s). Returns (started, ended)."""
    now = now or timezone.now()
    started = ended = 0
    for pk in PlannedDrain.objects.filter(state=DrainState.PLANNED, starts_at__lte=now).values_list("pk", flat=True):
        started += _start_plan(pk, now)
    due = PlannedDrain.objects.filter(state=DrainState.ACTIVE, ends_at__lte=now).values_list("pk", "node_id")
    for pk, node_id in due:
        with transaction.atomic():
            node = Node.objects.select_for_update().get(pk=node_id)
            plan = PlannedDrain.objects.select_for_update().get(pk=pk)
            if plan.state == DrainState.ACTIVE:
                _finish(plan, node, SYSTEM, "its window ended", now)
                ended += 1
    return started, ended


def _start_plan(plan_id: int, now) -> bool:
    with transaction.atomic():
        plan = PlannedDrain.objects.select_related("node").get(pk=plan_id)
        node = Node.objects.select_for_update().get(pk=plan.node_id)
        plan = PlannedDrain.objects.select_for_update().get(pk=plan_id)
        if plan.state != DrainState.PLANNED:
            return False
        if plan.ends_at is not None and plan.ends_at <= now:
            _close(plan, DrainState.ENDED, "its window passed before it could start", now)
            return False
        plan.state = DrainState.ACTIVE
        plan.applied = node.status in (NodeStatus.READY, NodeStatus.LOST)
        if not plan.applied:
            plan.end_note = f"the node was already drained ({node.status_reason}); that drain stands"[:200]
        plan.save(update_fields=["state", "applied", "end_note"])
        if node.status == NodeStatus.READY:
            _set_status(node.pk, NodeStatus.DRAINING, plan.status_reason(), SYSTEM, "drained",
                        message=f"planned drain #{plan.pk} started")
        announce_nodes([node.pk])
    return True


def _finish(plan: PlannedDrain, node: Node, by: audit.Actor, why: str, now) -> None:
    """End an active plan (under the node's and the plan's row locks); return the node if the plan
    still holds it."""
    _close(plan, DrainState.ENDED, why, now)
    if plan.applied and node.status == NodeStatus.DRAINING and node.status_reason == plan.status_reason():
        _set_status(node.pk, NodeStatus.READY, "", by, "undrained", message=f"planned drain #{plan.pk} {why}")
    else:
        audit.record(by, object_type="node", object_id=node.pk, object_repr=node.name, action="drain ended",
                     message=f"planned drain #{plan.pk} {why}; the node's status was left as it is")
        announce_nodes([node.pk])


def _close(plan: PlannedDrain, state: str, why: str, now) -> None:
    plan.state, plan.end_note, plan.ended_at = state, why[:200], now
    plan.save(update_fields=["state", "end_note", "ended_at"])


def _end_active_plans(node_id: int, by: audit.Actor, why: str) -> None:
    """A person changed the node's drain by hand: plans holding it now end without touching it."""
    now = timezone.now()
    for plan in PlannedDrain.objects.select_for_update().filter(node_id=node_id, state=DrainState.ACTIVE):
        _close(plan, DrainState.ENDED, why, now)


REASON_MAX = 200  # a node's or GPU's reason, as Node.status_reason and Gpu.cordon_reason hold it


def cordon_reason_problem(reason: str) -> str | None:
    """What is wrong with a site admin's reason for cordoning a GPU (None: nothing)."""
    if not reason.strip():
        return "say why (the reason is shown on the GPU and kept in the audit log)"
    if len(reason) > REASON_MAX:
        return f"the reason is {len(reason)} characters long; keep it to {REASON_MAX}"
    return None


def set_cordon(gpu_id: int, by: audit.Actor, cordoned: bool, reason: str = "") -> Gpu:
    """A cordoned GPU takes no new shares (the placement snapshot leaves it out); the shares on it
    keep running."""
    with transaction.atomic():
        gpu = Gpu.objects.select_for_update().select_related("node").get(pk=gpu_id)
        reason = (reason or (f"cordoned by {by.label}" if cordoned else ""))[:200]
        if gpu.cordoned != cordoned or gpu.cordon_reason != reason:
            before = {"cordoned": gpu.cordoned, "cordon_reason": gpu.cordon_reason}
            gpu.cordoned, gpu.cordon_reason = cordoned, reason
            gpu.save(update_fields=["cordoned", "cordon_reason"])
            audit.record(by, object_type="gpu", object_id=gpu.pk, object_repr=f"GPU {gpu.index} on {gpu.node.name}",
                         action="cordoned" if cordoned else "uncordoned", before=before,
                         after={"cordoned": cordoned, "cordon_reason": reason})
            request_cycle(f"GPU {gpu.uuid} {'cordoned' if cordoned else 'uncordoned'}", freed=True)
            announce_nodes([gpu.node_id])
    return gpu


def _replace_token_hash(node: Node, token_hash: str, **fields) -> str:
    """Store the node's new token hash ("" revokes) under the row lock; the connections that
    authenticated with the previous token are closed after commit, whether or not they have sent
    their hello. Returns the previous hash."""
    previous = Node.objects.select_for_update().values_list("agent_token_hash", flat=True).get(pk=node.pk)
    node.agent_token_hash = token_hash
    for name, value in fields.items():
        setattr(node, name, value)
    node.save(update_fields=["agent_token_hash", *fields])
    announce_token_retired(node.pk, previous)
    return previous


def issue_node_token(node: Node, by: audit.Actor = SYSTEM) -> str:
    """A new agent credential for the node (the old one stops working at once: its connections are
    closed, see portal.telemetry.signals). Shown once; stored hashed."""
    key = "tnode_" + secrets.token_urlsafe(32)
    with transaction.atomic():
        rotated = bool(_replace_token_hash(node, hash_secret(key), agent_token_created_at=timezone.now()))
        audit.record(by, object_type="node_token", object_id=node.pk, object_repr=node.name,
                     action="rotated" if rotated else "created", after={"created_at": node.agent_token_created_at
                                                                        .isoformat()},
                     message="the previous token is refused from now on" if rotated else "")
        demo_tokens.remember_after_commit(node.name, key)
    return key


def revoke_node_token(node: Node, by: audit.Actor = SYSTEM) -> None:
    with transaction.atomic():
        _replace_token_hash(node, "")
        audit.record(by, object_type="node_token", object_id=node.pk, object_repr=node.name,
                     action="revoked", message="the node's agent is refused until a new token is created")


def node_for_token(key: str) -> Node | None:
    if not key:
        return None
    return Node.objects.filter(agent_token_hash=hash_secret(key)).exclude(agent_token_hash="").first()


@transaction.atomic
def apply_inventory(nodes: list[dict]) -> tuple[int, int]:
    """Create or update nodes and GPUs from a validated inventory (see portal.fleet.inventory).
    Returns (nodes, gpus) written."""
    gpu_total = 0
    for spec in nodes:
        node, _ = Node.objects.update_or_create(
            name=spec["name"],
            defaults={"labels": spec["labels"], "cpu_milli": spec["cpu_milli"], "memory_mib": spec["memory_mib"]},
        )
        for gpu in spec["gpus"]:
            Gpu.objects.update_or_create(
                uuid=gpu["uuid"],
                defaults={"node": node, "index": gpu["index"], "model": gpu["model"],
                          "memory_mib": gpu["memory_mib"], "nvlink_peers": gpu["nvlink_peers"],
                          "numa_node": gpu["numa_node"]},
            )
            gpu_total += 1
    request_cycle("inventory changed", freed=True)
    return len(nodes), gpu_total


# What the cluster and the agents say about a node besides its GPUs: its address and allocatable
# CPU and memory. Written only when they change (the watch repeats nodes every few minutes).


def record_addresses(addresses: dict[str, str]) -> int:
    """node name → the address the cluster reports for it ("" for none). Returns the rows changed."""
    changed = []
    for name, address in addresses.items():
        rows = Node.objects.filter(name=name).exclude(address=address or None)
        ids = list(rows.values_list("pk", flat=True))
        if ids and rows.update(address=address or None):
            changed += ids
    announce_nodes(changed)  # agents probing GPU nodes' servers hear of the new address
    return len(changed)


def record_resources(node_id: int, cpu_milli: int, memory_mib: int) -> bool:
    """The node's allocatable CPU and memory as its agent reports them (placement counts pods
    against them: the engine's NodeCpu/NodeMemory filters, remote shares' client nodes). A change
    requests a placement cycle. Returns True when it changed."""
    with transaction.atomic():
        updated = Node.objects.filter(pk=node_id).exclude(cpu_milli=cpu_milli, memory_mib=memory_mib) \
            .update(cpu_milli=cpu_milli, memory_mib=memory_mib)
        if updated:
            request_cycle(f"node {node_id} reported {cpu_milli}m CPU and {memory_mib} MiB allocatable", freed=True)
    return bool(updated)


# Node loss, one writer for both causes (portal.telemetry: an agent fell silent; the placement
# app's cluster events: the cluster reports the node NotReady). The cause is a field.


def record_seen(node_ids: list[int], at) -> None:
    Node.objects.filter(pk__in=node_ids).update(last_seen=at)


def mark_lost(node_id: int, cause: str, reason: str) -> bool:
    """Mark the node lost for `cause` (a LostCause) unless it already is. Returns True when the
    status changed; the change requests a placement cycle."""
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        if node.status == NodeStatus.LOST:
            return False
        node.status, node.status_reason, node.lost_cause = NodeStatus.LOST, reason[:200], cause
        node.save(update_fields=["status", "status_reason", "lost_cause"])
        request_cycle(f"node {node.name} lost")
        announce_nodes([node.pk])
    return True


def mark_back(node_id: int, cause: str = LostCause.AGENT_SILENT) -> bool:
    """The evidence of `cause` is gone (the agent reported again, the cluster says Ready): a node
    lost for that cause is ready again; one lost for the other cause, or drained by staff, stays.
    Returns True when the status changed."""
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        if node.status != NodeStatus.LOST or node.lost_cause != cause:
            return False
        node.status, node.status_reason, node.lost_cause = NodeStatus.READY, "", ""
        plan = PlannedDrain.objects.filter(node=node, state=DrainState.ACTIVE, applied=True).first()
        if plan is not None:  # back inside its maintenance window: drained, returned at the plan's end
            node.status, node.status_reason = NodeStatus.DRAINING, plan.status_reason()
        node.save(update_fields=["status", "status_reason", "lost_cause"])
        request_cycle(f"node {node.name} back", freed=True)
        announce_nodes([node.pk])
    return True


def mark_lost_nodes(silent_for) -> list[str]:
    """Mark lost every ready or draining node whose agent has been silent for `silent_for`
    (a timedelta), while other agents are heard. Nodes that never reported are left alone: with
    no agent deployed there is nothing to miss. Returns the names marked lost."""
    cutoff = timezone.now() - silent_for
    names = []
    if not Node.objects.filter(last_seen__gte=cutoff).exists():
        # Not one agent heard: the portal's own ingestion was down (a restart, a long outage),
        # not every node at once. Marking them all lost would make orchestration act on nothing.
        return names
    silent = Node.objects.filter(last_seen__lt=cutoff).exclude(status=NodeStatus.LOST).values_list("pk", "name")
    reason = f"no agent report for {int(silent_for.total_seconds())} s"
    for pk, name in silent:
        # Re-checked under the row lock: the agent may have come back meanwhile.
        with transaction.atomic():
            if not Node.objects.select_for_update().filter(pk=pk, last_seen__lt=cutoff).exists():
                continue
            if mark_lost(pk, LostCause.AGENT_SILENT, reason):
                names.append(name)
    return names


def reconcile_gpus(node: Node, reported_gpus) -> dict[str, int]:
    """Trust the agent over the inventory for which of the node's GPUs are there: a GPU it no
    longer reports is flagged unhealthy (no new placements), one it reports again is healthy
    again. A GPU the inventory does not have is added cordoned, awaiting a site admin: an
    agent's word (its token may be stolen) must not create capacity that reservations are
    placed on. Model names stay as reported/seeded: reservations ask for them by those names.
    `reported_gpus`: the hello's GPUs (wire.agent_portal.GpuInfo). Returns UUID → Gpu pk of the
    reported GPUs the node has."""
    reported = {g.uuid: g for g in reported_gpus}
    known = {g.uuid: g for g in Gpu.objects.filter(node=node).only("pk", "uuid", "index", "healthy")}
    changed = False
    for uuid_, gpu in known.items():
        healthy = uuid_ in reported
        if gpu.healthy != healthy:
            Gpu.objects.filter(pk=gpu.pk).update(healthy=healthy)
            changed = True
    ids = {uuid_: gpu.pk for uuid_, gpu in known.items() if uuid_ in reported}
    taken = {g.index for g in known.values()}
    for uuid_, info in reported.items():
        if uuid_ in known:
            continue
        if info.index in taken or len(taken) >= MAX_GPUS_PER_NODE or Gpu.objects.filter(uuid=uuid_).exists():
            log.warning("node %s: the agent reports GPU %s (index %s), refused: its index or UUID is "
                        "taken, or the node has %s GPUs already", node.name, uuid_, info.index, len(taken))
            continue
        ids[uuid_] = Gpu.objects.create(
            node=node, uuid=uuid_, index=info.index, model=info.model[:64], memory_mib=info.memory_mib,
            nvlink_peers=list(info.nvlink_peers), numa_node=info.numa_node,
            cordoned=True, cordon_reason=AWAITING_APPROVAL).pk
        taken.add(info.index)
        log.warning("node %s: new GPU %s (%s) reported by its agent, cordoned until a site admin approves it",
                    node.name, uuid_, info.model[:64])
    if changed:
        gpus_changed(node)
    return ids


def gpus_changed(node: Node) -> None:
    """The agent's GPU list differs from ours (a GPU gone or new): placements must look again."""
    request_cycle(f"GPUs of node {node.name} changed", freed=True)
