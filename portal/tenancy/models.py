"""Teams (tenants), who belongs to them with which role, their quotas and exclusion groups, and
per-user API tokens."""

from __future__ import annotations

import hashlib
import secrets
from decimal import Decimal

from django.conf import settings
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models

LABEL_RE = r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
label_validator = RegexValidator(
    LABEL_RE, "must be 1-63 characters of letters, digits, '-', '_' or '.', starting and ending alphanumeric"
)


class Role(models.TextChoices):
    MEMBER = "member", "Member"
    ADMIN = "admin", "Team admin"
    MANAGER = "manager", "Manager (read-only)"


class Team(models.Model):
    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=120)
    # Quota: the guaranteed GPU share (sum of requests, whole GPUs count 1.0 each) the team may hold.
    quota_gpu_share = models.DecimalField(
        max_digits=8, decimal_places=3, default=Decimal("1.000"), validators=[MinValueValidator(0)]
    )
    quota_memory_mib = models.PositiveBigIntegerField(default=80 * 1024)
    quota_max_gpus = models.PositiveIntegerField(default=4)
    allow_over_quota = models.BooleanField(
        default=True, help_text="Accept priority-0 requests beyond the quota as opportunistic (preemptible)."
    )
    # Kubernetes namespace whose kubectl (sharedgpu/*) pods belong to this team; blank: the slug.
    namespace = models.CharField(max_length=63, blank=True)
    # Lifecycle policy.
    interactive_max_s = models.PositiveIntegerField(
        default=8 * 3600, help_text="Interactive ones without a duration end after this."
    )
    idle_threshold = models.DecimalField(
        max_digits=4, decimal_places=3, default=Decimal("0.050"),
        help_text="Using less than this fraction of the GPU is idle.",
    )
    idle_after_s = models.PositiveIntegerField(default=1800, help_text="Idle this long → flagged idle.")
    idle_reclaim = models.BooleanField(default=False, help_text="End idle reservations (else flag only).")
    requeue_on_node_lost = models.BooleanField(
        default=True, help_text="A lost node's reservations are requeued (else they fail)."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team__slug", "user__username"]
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="one_membership_per_team")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class ExclusionGroup(models.Model):
    """Gemini semantics: workloads with different exclusion labels never share a GPU."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="exclusion_groups")
    label = models.CharField(max_length=63, validators=[label_validator])
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team__slug", "label"]
        constraints = [models.UniqueConstraint(fields=["team", "label"], name="unique_exclusion_label")]

    def __str__(self) -> str:
        return f"{self.team}:{self.label}"


def hash_secret(secret: str) -> str:
    # Tokens are 256-bit random values, so a fast unsalted hash is enough (no dictionary to attack).
    return hashlib.sha256(secret.encode()).hexdigest()


class ApiToken(models.Model):
    """A per-user API token; only its hash is stored, the key is shown once at creation."""

    PREFIX_LEN = 8

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=80)
    prefix = models.CharField(max_length=PREFIX_LEN, db_index=True)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.user}:{self.name} ({self.prefix}…)"

    @staticmethod
    def generate_key() -> str:
        return secrets.token_urlsafe(32)
