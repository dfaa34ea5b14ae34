"""Departments and teams (tenants), who belongs to them with which role, their quotas per GPU
model, exclusion groups and affinity labels, the presets and policy their admins set, and per-user
API tokens."""

from __future__ import annotations

import hashlib
import secrets
from decimal import ROUND_HALF_UP, Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from portal.connect.kinds import AppKind

LABEL_RE = r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
label_validator = RegexValidator(
    LABEL_RE, "must be 1-63 characters of letters, digits, '-', '_' or '.', starting and ending alphanumeric"
)


class Role(models.TextChoices):
    MEMBER = "member", "Member"
    ADMIN = "admin", "Team admin"
    MANAGER = "manager", "Manager (read-only)"


# Departments nest at most this deep (a top-level department is level 1); the organisation above
# them is implicit (no row).
MAX_DEPARTMENT_DEPTH = 4


class Department(models.Model):
    """A node of the organisation's tree above teams. Written only by portal.tenancy.departments."""

    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=120)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children",
                               help_text="Blank: directly under the organisation.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


ANY_MODEL = "*"  # the bucket of every GPU model without a quota row of its own at that unit
GIB = Decimal(1024)
MILLI = Decimal("0.001")


def mib_to_gib(mib: int) -> Decimal:
    """MiB as GiB to 3 decimals. Exact when `mib` is a multiple of 128 (1/8 GiB); otherwise rounded
    to the nearest 0.001 GiB (1.024 MiB), half up, so within 0.512 MiB."""
    return (Decimal(int(mib)) / GIB).quantize(MILLI, rounding=ROUND_HALF_UP)


def gib_to_mib(gib: Decimal) -> int:
    """GiB as whole MiB (half up): mib_to_gib's inverse wherever that one was exact."""
    return int((Decimal(gib) * GIB).to_integral_value(rounding=ROUND_HALF_UP))


class Team(models.Model):
    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=120)
    # Written by portal.tenancy.teams (at creation) and departments.move_team (which checks quotas).
    department = models.ForeignKey(Department, null=True, blank=True, on_delete=models.PROTECT, related_name="teams",
                                   help_text="Blank: directly under the organisation.")
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
    # The owner is warned when the reservation is flagged idle; reclaim waits this long after it.
    idle_warning_s = models.PositiveIntegerField(
        default=900, validators=[MinValueValidator(60), MaxValueValidator(86400)],
        help_text="Warned this long before an idle reservation is reclaimed.",
    )
    requeue_on_node_lost = models.BooleanField(
        default=True, help_text="A lost node's reservations are requeued (else they fail)."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    # The team's flat quota of before departments, now its `*` Quota row (deprecated: read
    # portal.tenancy.quotas.quotas_of, write quotas.replace_quotas or teams.set_quota). 0 without
    # a `*` row. One query per read unless the team's quotas were prefetched (prefetch_related("quotas")).
    def _any_model_quota(self) -> Quota | None:
        cached = getattr(self, "_prefetched_objects_cache", {}).get("quotas")
        if cached is not None:
            return next((q for q in cached if q.gpu_model == ANY_MODEL), None)
        return Quota.objects.filter(team_id=self.pk, gpu_model=ANY_MODEL).first() if self.pk else None

    @property
    def quota_gpu_share(self) -> Decimal:
        """Deprecated: the `*` quota row's gpu_share."""
        row = self._any_model_quota()
        return row.gpu_share if row else Decimal("0.000")

    @property
    def quota_memory_mib(self) -> int:
        """Deprecated: the `*` quota row's gpu_memory_gib, in MiB."""
        row = self._any_model_quota()
        return gib_to_mib(row.gpu_memory_gib) if row else 0

    @property
    def quota_max_gpus(self) -> int:
        """Deprecated: the `*` quota row's gpus."""
        row = self._any_model_quota()
        return row.gpus if row else 0


class Quota(models.Model):
    """A team's or a department's quota for one bucket: a GPU model, or `*` for every model without
    a row of its own there. Written only by portal.tenancy.quotas, which checks that children's
    quotas fit their parent's. Limits: null = unlimited."""

    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="quotas")
    department = models.ForeignKey(Department, null=True, blank=True, on_delete=models.CASCADE,
                                   related_name="quotas")
    gpu_model = models.CharField(max_length=100, help_text="A GPU model name, or * for any other model.")
    gpu_share = models.DecimalField(max_digits=10, decimal_places=3,
                                    help_text="Guaranteed compute: whole GPUs count 1.0 each.")
    gpu_memory_gib = models.DecimalField(max_digits=12, decimal_places=3, help_text="Guaranteed GPU memory.")
    gpus = models.PositiveIntegerField(help_text="GPUs held at once (a share of one GPU counts 1).")
    borrow_gpu_share = models.DecimalField(max_digits=10, decimal_places=3, null=True, blank=True)
    borrow_gpu_memory_gib = models.DecimalField(max_digits=12, decimal_places=3, null=True, blank=True)
    borrow_gpus = models.PositiveIntegerField(null=True, blank=True)
    lend_gpu_share = models.DecimalField(max_digits=10, decimal_places=3, null=True, blank=True)
    lend_gpu_memory_gib = models.DecimalField(max_digits=12, decimal_places=3, null=True, blank=True)
    lend_gpus = models.PositiveIntegerField(null=True, blank=True)
    weight = models.DecimalField(max_digits=8, decimal_places=3, default=Decimal("1.000"),
                                 help_text="Share of what is left over, relative to the siblings'.")

    class Meta:
        ordering = ["gpu_model"]
        constraints = [
            models.UniqueConstraint(fields=["team", "gpu_model"], name="unique_team_quota_model"),
            models.UniqueConstraint(fields=["department", "gpu_model"], name="unique_department_quota_model"),
            models.CheckConstraint(
                condition=(models.Q(team__isnull=False) & models.Q(department__isnull=True))
                | (models.Q(team__isnull=True) & models.Q(department__isnull=False)),
                name="quota_has_one_owner",
            ),
            models.CheckConstraint(
                condition=models.Q(gpu_share__gte=0) & models.Q(gpu_memory_gib__gte=0)
                & (models.Q(borrow_gpu_share__isnull=True) | models.Q(borrow_gpu_share__gte=0))
                & (models.Q(borrow_gpu_memory_gib__isnull=True) | models.Q(borrow_gpu_memory_gib__gte=0))
                & (models.Q(lend_gpu_share__isnull=True) | models.Q(lend_gpu_share__gte=0))
                & (models.Q(lend_gpu_memory_gib__isnull=True) | models.Q(lend_gpu_memory_gib__gte=0)),
                name="quota_amounts_not_negative",
            ),
            models.CheckConstraint(condition=models.Q(weight__gt=0), name="quota_weight_positive"),
        ]

    def __str__(self) -> str:
        owner = self.team or f"department {self.department}"
        return f"{owner}:{self.gpu_model}"


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    # What the member's requests carry unless they say otherwise (set by the team's admins).
    default_exclusion = models.ForeignKey("ExclusionGroup", null=True, blank=True, on_delete=models.SET_NULL,
                                          related_name="default_for")
    default_affinity = models.ForeignKey("AffinityLabel", null=True, blank=True, on_delete=models.SET_NULL,
                                         related_name="default_for")
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


class AffinityLabel(models.Model):
    """A label a team's requests carry as affinity (shares with it go to the same GPUs) or
    anti-affinity (shares with it go to different GPUs)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="affinity_labels")
    label = models.CharField(max_length=63, validators=[label_validator])
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team__slug", "label"]
        constraints = [models.UniqueConstraint(fields=["team", "label"], name="unique_affinity_label")]

    def __str__(self) -> str:
        return f"{self.team}:{self.label}"


SHARE_VALIDATORS = [MinValueValidator(Decimal("0.001")), MaxValueValidator(Decimal("1"))]
LONGEST_DURATION_S = 30 * 86400  # the longest any reservation may run (portal.reservations.rules)


class Preset(models.Model):
    """A request shape the team's members see first on the request page. Checked by
    portal.reservations.presets against the same rules a request is, so a preset always submits."""

    KIND_CHOICES = [("interactive", "Interactive (notebook)"), ("batch", "Batch job")]

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="presets")
    name = models.CharField(max_length=80)
    kind = models.CharField(max_length=16, choices=KIND_CHOICES, default="interactive")
    gpu_model = models.CharField(max_length=200, blank=True, help_text="A model, or several joined by '|'; blank: any")
    gpu_request = models.DecimalField(max_digits=4, decimal_places=3, validators=SHARE_VALIDATORS)
    gpu_limit = models.DecimalField(max_digits=4, decimal_places=3, validators=SHARE_VALIDATORS)
    gpu_memory_mib = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    max_duration_s = models.PositiveIntegerField(null=True, blank=True)
    image = models.CharField(max_length=255)
    command = models.JSONField(default=list, blank=True)
    # The app its reservations open through the portal (portal.connect); port blank: the app's default.
    app = models.CharField(max_length=16, choices=AppKind.choices, default=AppKind.NONE, blank=True)
    app_port = models.PositiveIntegerField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["team__slug", "name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="unique_preset_name"),
            models.CheckConstraint(
                condition=models.Q(gpu_request__gt=0) & models.Q(gpu_request__lte=models.F("gpu_limit"))
                & models.Q(gpu_limit__lte=1),
                name="preset_share_within_bounds",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.team}:{self.name}"


class TeamPolicy(models.Model):
    """What a team's admins decide beyond the Team row, and the limits the site admins set on it.

    The rest of a team's policy stays on Team, where lifecycle reads it: `interactive_max_s` (the
    default duration of interactive reservations given none), `idle_threshold`, `idle_after_s`,
    `idle_reclaim` (warn then reclaim, or warn only), `idle_warning_s` (how long after the warning
    the reclaim comes) and `allow_over_quota`. `reclaim_grace_s` is here. Read the whole policy
    through portal.tenancy.policy.policy_of(team); a team without a row has the defaults below.
    """

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="policy")
    # Set by the team's admins, within the limits below.
    max_duration_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="The longest duration a member may ask for (blank: the site limit)."
    )
    max_priority_member = models.PositiveSmallIntegerField(default=100, validators=[MaxValueValidator(100)])
    max_priority_admin = models.PositiveSmallIntegerField(default=100, validators=[MaxValueValidator(100)])
    # Off by default: a remote share sends the workload's GPU calls and data over the network to
    # another node, which a team should choose knowingly (preload/remote/README.md).
    allow_remote = models.BooleanField(
        default=False, help_text="Members may let a request use a share of a GPU on another node (remote share)."
    )
    # How long a borrowed reservation runs on once told it will be reclaimed (its pod gets SIGTERM
    # with this grace).
    # Off by default: an app is its owner's workspace (files, kernels, secrets in memory).
    connect_admins = models.BooleanField(
        default=False, help_text="Team admins may open the apps (notebooks) of the team's reservations."
    )
    reclaim_grace_s = models.PositiveIntegerField(
        default=300, validators=[MinValueValidator(0), MaxValueValidator(86400)],
        help_text="Warned this long before a borrowed reservation is reclaimed.",
    )
    # A booking with no process on its GPU this long after it was placed is released (a no-show).
    booking_no_show_min = models.PositiveIntegerField(
        default=20, validators=[MinValueValidator(1), MaxValueValidator(1440)],
        help_text="Minutes a started booking may go without a process on its GPU before it is released.",
    )
    # Set by site admins: what the team's admins may choose.
    limit_duration_s = models.PositiveIntegerField(
        default=LONGEST_DURATION_S, validators=[MinValueValidator(60), MaxValueValidator(LONGEST_DURATION_S)],
        help_text="Neither the maximum nor the default duration may exceed this.",
    )
    limit_priority = models.PositiveSmallIntegerField(
        default=100, validators=[MaxValueValidator(100)], help_text="No role's priority ceiling may exceed this."
    )
    limit_idle_after_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="The longest idle time the team may allow before acting (blank: any)."
    )
    limit_idle_warning_s = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="The longest warning the team may give before reclaiming an idle reservation (blank: any).",
    )
    limit_idle_threshold = models.DecimalField(
        max_digits=4, decimal_places=3, default=Decimal("0"),
        validators=[MinValueValidator(0), MaxValueValidator(1)],
        help_text="The lowest idle threshold the team may set.",
    )
    limit_require_reclaim = models.BooleanField(
        default=False, help_text="The team must reclaim idle reservations (warn-only is not allowed)."
    )
    limit_allow_over_quota = models.BooleanField(
        default=True, help_text="The team may allow opportunistic (over-quota) use."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "team policies"

    def __str__(self) -> str:
        return f"policy of {self.team}"


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
        constraints = [models.UniqueConstraint(fields=["user", "name"], condition=models.Q(revoked_at__isnull=True),
                                               name="one_live_token_per_name")]

    def __str__(self) -> str:
        return f"{self.user}:{self.name} ({self.prefix}…)"

    @staticmethod
    def generate_key() -> str:
        return secrets.token_urlsafe(32)
