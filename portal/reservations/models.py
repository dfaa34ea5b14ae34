"""Reservations (what a user asked for), allocations (the GPU shares one holds) and the audit log
of every state transition."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from portal.connect.kinds import AppKind
from portal.fleet.models import Gpu
from portal.tenancy import roles
from portal.tenancy.models import Team

from .states import State


class Kind(models.TextChoices):
    INTERACTIVE = "interactive", "Interactive (notebook)"
    BATCH = "batch", "Batch job"


class Source(models.TextChoices):
    PORTAL = "portal", "Portal or API"
    KUBECTL = "kubectl", "kubectl pod"


class Admission(models.TextChoices):
    """How a reservation counts against quotas (scheduler.core.fairshare.Admission)."""

    GUARANTEED = "guaranteed", "Guaranteed (within the team's quota)"
    BORROWED = "borrowed", "Borrowed (beyond the quota; may be reclaimed)"
    OPPORTUNISTIC = "opportunistic", "Opportunistic (idle capacity; preemptible)"


COUNTED = (Admission.GUARANTEED, Admission.BORROWED)  # what counts against quotas


class Sharing(models.TextChoices):
    EXCLUSIVE = "exclusive", "Exclusive GPU"
    LOCAL = "local", "Local share"
    REMOTE = "remote", "Remote share"


class ReservationQuerySet(models.QuerySet):
    def visible_to(self, user) -> ReservationQuerySet:
        """The reservations of the teams `user` may see (all, for staff): pages, API and reports agree."""
        ids = roles.visible_team_ids(user)
        return self if ids is None else self.filter(team_id__in=ids)


class Reservation(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="reservations")
    # Indexed by (team, state) below, which serves lookups by team alone as well.
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="reservations", db_index=False)
    name = models.CharField(max_length=63, blank=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.BATCH)
    image = models.CharField(max_length=255)
    command = models.JSONField(default=list, blank=True)
    # The app the portal opens for its owner (portal.connect); app_port: where it listens in the pod.
    app = models.CharField(max_length=16, choices=AppKind.choices, default=AppKind.NONE, blank=True)
    app_port = models.PositiveIntegerField(null=True, blank=True)

    gpu_request = models.DecimalField(max_digits=4, decimal_places=3)
    gpu_limit = models.DecimalField(max_digits=4, decimal_places=3)
    gpu_memory_mib = models.PositiveIntegerField()
    gpu_count = models.PositiveSmallIntegerField(default=1)
    gpu_model = models.CharField(max_length=200, blank=True, help_text="A model, or several joined by '|'")
    priority = models.PositiveSmallIntegerField(default=50, validators=[MinValueValidator(0), MaxValueValidator(100)])
    # How it counts against quotas: decided when placed (a waiting one shows what it would be now).
    admission = models.CharField(max_length=16, choices=Admission.choices, default=Admission.GUARANTEED)
    # A borrowed reservation being reclaimed: when it is preempted (its owner was warned, its pod
    # got SIGTERM with its team's grace). Null otherwise.
    reclaim_at = models.DateTimeField(null=True, blank=True)
    requeue_on_preempt = models.BooleanField(default=False)
    # The request may run on a share of a GPU on another node (preload/remote), if its team's policy
    # allows it (portal.tenancy.policy); placement then chooses exclusive, local or remote.
    remote_allowed = models.BooleanField(default=False)

    affinity = models.CharField(max_length=63, blank=True)
    anti_affinity = models.CharField(max_length=63, blank=True)
    exclusion = models.CharField(max_length=63, blank=True)

    group_name = models.CharField(max_length=63, blank=True)
    group_headcount = models.PositiveSmallIntegerField(null=True, blank=True)
    group_threshold = models.DecimalField(max_digits=4, decimal_places=3, null=True, blank=True)

    max_duration_s = models.PositiveIntegerField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    # A booking's window (state `booked` until starts_at, then pending → placed → running as any
    # other): both set, or neither. `ends_at` is the window's end, when the placed reservation
    # expires (services.ends_at). Weekly repeats share one `booking_series`.
    starts_at = models.DateTimeField(null=True, blank=True)
    ends_at = models.DateTimeField(null=True, blank=True)
    booking_series = models.UUIDField(null=True, blank=True)

    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    state_reason = models.CharField(max_length=500, blank=True)
    node = models.ForeignKey("fleet.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # How the placement shares its GPU (scheduler.core.remote), and why, in words. A remote share's
    # GPU is on `node` (its allocations are there) and its pod runs on `client_node`.
    sharing = models.CharField(max_length=16, choices=Sharing.choices, blank=True)
    sharing_reason = models.CharField(max_length=300, blank=True)
    client_node = models.ForeignKey("fleet.Node", null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")

    # Where the request came from; kubectl ones are bound to the user's own pod.
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.PORTAL)
    # The pod that runs it: ours (name from the placement attempt) or the user's (kubectl path).
    pod_namespace = models.CharField(max_length=63, blank=True)
    pod_name = models.CharField(max_length=253, blank=True)
    pod_uid = models.CharField(max_length=64, blank=True)  # looked up only for kubectl pods: see Meta
    attempt = models.PositiveIntegerField(default=0, help_text="How many times it has been placed")
    # "Why not yet" beyond state_reason: place in the queue and a rough start estimate (pending only).
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    estimated_start = models.DateTimeField(null=True, blank=True)
    expiry_warned_at = models.DateTimeField(null=True, blank=True)
    # Set while measured utilization stays under the team's idle threshold.
    idle_since = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    placed_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ReservationQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        # Every index is rewritten when a placement or a bind updates the row (those updates touch
        # indexed columns), so only the ones queries use: no text-pattern twins of `state` and
        # `pod_uid` (never searched with LIKE), no plain `pod_uid` (kubectl lookups use the
        # constraint's partial index). `reservation_with_pod` holds only rows that name a pod (the
        # live ones and a few kept for their logs): housekeeping looks for ended pods among them
        # every 5 s, which was a scan of every reservation ever made.
        indexes = [models.Index(fields=["team", "state"]), models.Index(fields=["state"], name="reservation_state"),
                   models.Index(fields=["state"], name="reservation_with_pod", condition=models.Q(pod_name__gt="")),
                   # The bookings over a window (capacity checks, the calendar, the start task).
                   models.Index(fields=["starts_at"], name="reservation_booking",
                                condition=models.Q(starts_at__isnull=False))]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(gpu_request__gt=0) & models.Q(gpu_request__lte=models.F("gpu_limit"))
                & models.Q(gpu_limit__lte=1),
                name="share_within_bounds",
            ),
            models.CheckConstraint(condition=models.Q(gpu_count__gte=1), name="at_least_one_gpu"),
            models.CheckConstraint(
                condition=models.Q(starts_at__isnull=True, ends_at__isnull=True)
                | models.Q(starts_at__isnull=False, ends_at__gt=models.F("starts_at")),
                name="booking_window_ordered",
            ),
            # One reservation per kubectl pod, however often the pod is seen.
            models.UniqueConstraint(fields=["pod_uid"], condition=models.Q(source="kubectl"),
                                    name="one_reservation_per_kubectl_pod"),
        ]

    def __str__(self) -> str:
        return f"reservation {self.pk} ({self.state})"

    @property
    def opportunistic(self) -> bool:
        """Runs on idle capacity, counted in no quota, preemptible (the API's `opportunistic`)."""
        return self.admission == Admission.OPPORTUNISTIC


class Allocation(models.Model):
    """One GPU share held by a reservation. `released_at` set = no longer held."""

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="allocations")
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="allocations")
    gpu_request = models.DecimalField(max_digits=4, decimal_places=3)
    gpu_limit = models.DecimalField(max_digits=4, decimal_places=3)
    gpu_memory_mib = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["reservation_id", "gpu_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["reservation", "gpu"], condition=models.Q(released_at__isnull=True),
                name="one_live_allocation_per_gpu",
            )
        ]

    def __str__(self) -> str:
        return f"{self.reservation_id} on {self.gpu_id}: {self.gpu_request}"


class StateTransition(models.Model):
    """Audit log: every state change, who made it, when and why."""

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="transitions")
    from_state = models.CharField(max_length=16, choices=State.choices, blank=True)
    to_state = models.CharField(max_length=16, choices=State.choices)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_label = models.CharField(max_length=64, help_text="Username or system component")
    reason = models.CharField(max_length=500, blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.reservation_id}: {self.from_state or '∅'} → {self.to_state}"


class CalendarFeed(models.Model):
    """A user's secret iCal feed of their bookings: the URL carries a token whose hash is kept here
    (shown once, at creation; regenerating it makes the old URL answer 404)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="calendar_feed")
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"calendar feed of {self.user_id}"


class PodLog(models.Model):
    """The last lines of a reservation's pod, read just before the pod was deleted (cancelled,
    expired, preempted, reclaimed, node lost, or finished and kept long enough), so its page still
    shows them. One row per reservation: the latest pod's."""

    reservation = models.OneToOneField(Reservation, on_delete=models.CASCADE, primary_key=True,
                                       related_name="kept_log")
    pod_name = models.CharField(max_length=253)
    text = models.TextField()
    kept_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.reservation_id}: {self.pod_name}"
