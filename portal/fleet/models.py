"""The GPU fleet: nodes (with their agent credential) and the GPUs on them."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q, Value
from django.db.models.functions import Replace


class NodeStatus(models.TextChoices):
    READY = "ready", "Ready"
    DRAINING = "draining", "Draining"
    LOST = "lost", "Lost"


class LostCause(models.TextChoices):
    """Why a node is lost: each cause is undone only by its own evidence (the agent heard again,
    the cluster reporting the node Ready), so one never clears a loss the other found."""

    AGENT_SILENT = "agent_silent", "Its agent stopped reporting"
    CLUSTER_NOT_READY = "cluster_not_ready", "The cluster reports it not ready"


class Node(models.Model):
    name = models.CharField(max_length=253, unique=True)
    labels = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=NodeStatus.choices, default=NodeStatus.READY)
    status_reason = models.CharField(max_length=200, blank=True)
    lost_cause = models.CharField(max_length=24, choices=LostCause.choices, blank=True)
    cpu_milli = models.PositiveIntegerField(default=0, help_text="Allocatable CPU in millicores (0: unknown)")
    memory_mib = models.PositiveBigIntegerField(default=0, help_text="Allocatable memory (0: unknown)")
    # Where pods on other nodes reach this node (remote shares' server): its InternalIP as the
    # cluster reports it; empty where the cluster says nothing (the local backend): then its name.
    address = models.GenericIPAddressField(null=True, blank=True, help_text="InternalIP the cluster reports")
    last_seen = models.DateTimeField(null=True, blank=True)
    # The node agent's credential: only a hash is kept (manage.py node_token shows the key once).
    agent_token_hash = models.CharField(max_length=64, blank=True, db_index=True)
    agent_token_created_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


def gpus_name(indexes, node: str, model: str) -> str:
    """GPUs as a person reads them: "GPU 0 on a100-node-1 (A100-80GB)", "GPUs 0, 1 on a100-node-1
    (A100-80GB)"; never their UUIDs, which are for machines."""
    indexes = list(indexes)
    which = f"GPU {indexes[0]}" if len(indexes) == 1 else f"GPUs {', '.join(map(str, indexes))}"
    return f"{which} on {node}" + (f" ({model})" if model else "")


# A GPU its node's agent reported that is not in the inventory: recorded cordoned with this reason,
# and approved by a site admin uncordoning it. An agent's word (its token may be stolen) adds no
# capacity: nothing is placed on such a GPU, and reports count none of its time.
AWAITING_APPROVAL = "reported by the node's agent, not in the inventory: approve by uncordoning"


def awaiting_approval(path: str = "") -> Q:
    """The GPUs nobody has approved yet; `path` reaches the GPU from another model ("gpu__")."""
    return Q(**{f"{path}cordoned": True, f"{path}cordon_reason": AWAITING_APPROVAL})


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    uuid = models.CharField(max_length=96, unique=True)
    index = models.PositiveSmallIntegerField()
    model = models.CharField(max_length=64, db_index=True)
    # The model as a Kubernetes label value can hold it (KubeShare's `sharedgpu/gpu_model`): the NVML
    # name with spaces as dashes, as KubeShare writes it ("NVIDIA A100-SXM4-80GB" ->
    # "NVIDIA-A100-SXM4-80GB"). Computed by the database, so no writer can forget it. See model_names.
    model_label = models.GeneratedField(expression=Replace("model", Value(" "), Value("-")),
                                        output_field=models.CharField(max_length=64), db_persist=True)
    memory_mib = models.PositiveIntegerField()
    nvlink_peers = models.JSONField(default=list, blank=True, help_text="Indices of NVLink-connected GPUs")
    numa_node = models.SmallIntegerField(null=True, blank=True)
    healthy = models.BooleanField(default=True)
    # Cordoned by a site admin: no new shares; what runs there keeps running.
    cordoned = models.BooleanField(default=False)
    cordon_reason = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="unique_gpu_index_per_node")]

    def __str__(self) -> str:
        return f"{self.node.name}/{self.index} ({self.model})"


class NodeLink(models.Model):
    """The network from a node (where a pod would run) to a GPU node's remote server, as the first
    node's agent last measured it (agents/remote/probe.py, the `links` message of wire/PROTOCOL.md).
    Each report replaces the node's links; placement scores remote shares by them
    (scheduler.core.remote) and ignores ones older than TESSERA_LINK_MAX_AGE_S."""

    client = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="links_out")
    gpu_node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="links_in")
    rtt_ms = models.FloatField()
    bandwidth_mbps = models.FloatField()
    measured_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["client", "gpu_node"], name="one_link_per_node_pair")]

    def __str__(self) -> str:
        return f"{self.client_id} → {self.gpu_node_id}: {self.bandwidth_mbps:g} Mbit/s, {self.rtt_ms:g} ms"


class DrainState(models.TextChoices):
    PLANNED = "planned", "Planned"
    ACTIVE = "active", "Draining the node"
    ENDED = "ended", "Ended"
    CANCELLED = "cancelled", "Cancelled"


class PlannedDrain(models.Model):
    """A maintenance window a site admin planned for a node: from `starts_at` the node is drained,
    at `ends_at` (none: open-ended) it is ready again (fleet.services.apply_due_drains). Bookings
    count the node's GPUs out over the window. `applied`: the node was drained by this plan (it was
    ready at the start), so its end returns the node; a node a person drained or returned meanwhile
    ends the plan (their word stands)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="planned_drains")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField(null=True, blank=True)
    reason = models.CharField(max_length=200)
    state = models.CharField(max_length=16, choices=DrainState.choices, default=DrainState.PLANNED)
    applied = models.BooleanField(default=False)
    end_note = models.CharField(max_length=200, blank=True, help_text="How the plan ended or was cancelled")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["starts_at", "pk"]
        indexes = [models.Index(fields=["state", "starts_at"], name="planned_drain_due")]
        constraints = [models.CheckConstraint(condition=Q(ends_at__isnull=True) | Q(ends_at__gt=F("starts_at")),
                                              name="planned_drain_ends_after_start")]

    def __str__(self) -> str:
        return f"{self.node_id}: {self.starts_at:%Y-%m-%d %H:%M}–{self.ends_at or 'open'}"

    def overlaps(self, start, end) -> bool:
        return self.starts_at < end and (self.ends_at is None or self.ends_at > start)

    def status_reason(self) -> str:
        """What the node's status says while this plan drains it."""
        until = f" until {self.ends_at:%Y-%m-%d %H:%M} UTC" if self.ends_at else ""
        return f"planned drain{until}: {self.reason}"[:200]


# Plans that still hold the node's GPUs out of some future (planned or draining now).
OPEN_DRAINS = (DrainState.PLANNED, DrainState.ACTIVE)
