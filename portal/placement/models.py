"""The placement fence: the highest fencing token whose holder has committed a decision.

A cycle commits each decision only if its token is at least this high (and raises it): a cycle
that lost its lock (paused, expired, partitioned) can never write after a newer holder has.
"""

from django.db import models


class Fence(models.Model):
    # One row per cluster; the portal manages one cluster.
    accepted = models.BigIntegerField(default=0, help_text="Highest token that committed")
    issued = models.BigIntegerField(default=0, help_text="Last token handed out without Redis")

    def __str__(self) -> str:
        return f"fence {self.accepted}"


class ForeignHold(models.Model):
    """A share of one of our GPUs that a claim allocated by another scheduler held (a pod left to the
    default kube-scheduler that names our DeviceClasses), from when housekeeping first saw it until
    the first housekeeping that no longer did (foreign_claims.observe). Its team is the namespace's
    (as for KubeShare-labelled pods); none where the namespace belongs to no team: the reports'
    unattributed row. The reports count its allocated GPU-hours beside the reservations'."""

    claim = models.CharField(max_length=320, help_text="namespace/name of the ResourceClaim")
    claim_uid = models.CharField(max_length=64)
    namespace = models.CharField(max_length=63)
    team = models.ForeignKey("tenancy.Team", null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="foreign_holds")
    gpu = models.ForeignKey("fleet.Gpu", null=True, blank=True, on_delete=models.SET_NULL, related_name="foreign_holds",
                            help_text="None: a GPU the portal's inventory does not know")
    node_name = models.CharField(max_length=253)
    gpu_index = models.PositiveSmallIntegerField()
    gpu_request = models.DecimalField(max_digits=4, decimal_places=3, help_text="compute consumed, in GPUs")
    gpu_memory_mib = models.PositiveIntegerField(null=True, blank=True, help_text="None: the whole card's")
    created_at = models.DateTimeField(help_text="first seen held")
    released_at = models.DateTimeField(null=True, blank=True, db_index=True, help_text="first seen gone")

    class Meta:
        indexes = [models.Index(fields=["created_at"])]
        constraints = [models.UniqueConstraint(fields=["claim_uid", "node_name", "gpu_index"],
                                               condition=models.Q(released_at__isnull=True),
                                               name="one_open_foreign_hold_per_device")]

    def __str__(self) -> str:
        return f"{self.claim} on {self.node_name}/gpu-{self.gpu_index}"
