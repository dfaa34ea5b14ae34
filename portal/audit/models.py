"""The audit log of admin changes: who changed which team, membership, group, label, preset,
policy, quota, node, GPU or node token, when, through what, and the values before and after.
Reservation transitions have their own log (portal.reservations.models.StateTransition); the
audit page shows both."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Via(models.TextChoices):
    WEB = "web", "Browser"
    API = "api", "API"
    CLI = "cli", "Command line"
    SYSTEM = "system", "System"


class AuditEntry(models.Model):
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")
    actor_label = models.CharField(max_length=150, help_text="Username or system component")
    via = models.CharField(max_length=8, choices=Via.choices, default=Via.SYSTEM)
    # The team the object belongs to (blank for fleet-wide objects: nodes, GPUs).
    team = models.ForeignKey("tenancy.Team", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # What was changed: a kind ("membership", "node", ...), its id and a readable name kept as it
    # was then (the object may be gone since).
    object_type = models.CharField(max_length=32)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200)
    action = models.CharField(max_length=32)
    before = models.JSONField(default=dict, blank=True)
    after = models.JSONField(default=dict, blank=True)
    message = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["team", "at"]),
            models.Index(fields=["object_type", "object_id"]),
            models.Index(fields=["actor", "at"]),
        ]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M} {self.actor_label} {self.action} {self.object_type} {self.object_repr}"
