"""API representations. Field-level formats are checked here; domain rules (models, memory,
quota) by the services, which report per-field errors the same way."""

from __future__ import annotations

from decimal import Decimal

from django.db.models import prefetch_related_objects
from django.db.models.manager import BaseManager
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.connect.kinds import AppKind
from portal.fleet.model_names import display_model
from portal.fleet.models import Gpu, Node
from portal.reservations.models import Allocation, Kind, Reservation, Sharing, StateTransition
from portal.tenancy import departments, roles
from portal.tenancy.models import ApiToken, ExclusionGroup, Team

from . import reservation_related
from .representation import SharedFieldsRepresentation, output_zone, represent
from .strict import StrictTypesMixin

SHARE = {"max_digits": 4, "decimal_places": 3, "coerce_to_string": False}


class SafeSlugRelatedField(serializers.SlugRelatedField):
    """Refuses values that cannot name anything (NUL bytes, over-long) before they reach the
    database, which would otherwise fail on them."""

    max_length = 150

    def to_internal_value(self, data):
        if not isinstance(data, str) or not data or "\x00" in data or len(data) > self.max_length:
            self.fail("invalid")
        return super().to_internal_value(data)


class VisibleTeamField(SafeSlugRelatedField):
    """A team given by slug, looked up among the teams the user may see (others read as unknown)."""

    default_error_messages = {
        "does_not_exist": "no team '{value}' that you belong to",
        "invalid": "must be a team slug",
    }

    def __init__(self, **kwargs):
        super().__init__(slug_field="slug", **kwargs)

    def get_queryset(self):
        return roles.visible_teams(self.context["request"].user)


class AllocationSerializer(SharedFieldsRepresentation, serializers.ModelSerializer):
    gpu_uuid = serializers.CharField(source="gpu.uuid", read_only=True)
    gpu_index = serializers.IntegerField(source="gpu.index", read_only=True)
    node = serializers.CharField(source="gpu.node.name", read_only=True)
    gpu_request = serializers.DecimalField(**SHARE, read_only=True)
    gpu_limit = serializers.DecimalField(**SHARE, read_only=True)

    class Meta:
        model = Allocation
        fields = ["gpu_uuid", "gpu_index", "node", "gpu_request", "gpu_limit", "gpu_memory_mib"]


class ReservationListSerializer(serializers.ListSerializer):
    """Loads what every reservation of the list shows from other tables in one query, then
    renders each (reservation_related)."""

    def to_representation(self, data):
        items = list(data.all() if isinstance(data, BaseManager) else data)
        reservation_related.attach(items)
        zone = output_zone()
        return [represent(type(self.child), item, zone) for item in items]


class ReservationSerializer(SharedFieldsRepresentation, StrictTypesMixin, serializers.ModelSerializer):
    team = VisibleTeamField()
    owner = serializers.CharField(source="owner.username", read_only=True)
    node = serializers.CharField(source="node.name", read_only=True, default=None, allow_null=True)
    kind = serializers.ChoiceField(choices=Kind.choices, default=Kind.BATCH)
    image = serializers.CharField(max_length=255)
    command = serializers.ListField(child=serializers.CharField(max_length=4096, allow_blank=True),
                                    max_length=256, required=False, default=list)
    gpu_request = serializers.DecimalField(**SHARE, min_value=Decimal("0.001"), max_value=Decimal("1"))
    gpu_limit = serializers.DecimalField(**SHARE, min_value=Decimal("0.001"), max_value=Decimal("1"),
                                         required=False, allow_null=True)
    gpu_memory_mib = serializers.IntegerField(min_value=1, max_value=10_000_000)
    gpu_count = serializers.IntegerField(min_value=1, max_value=64, default=1)
    gpu_model = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    priority = serializers.IntegerField(min_value=0, max_value=100, default=50)
    group_headcount = serializers.IntegerField(min_value=1, max_value=4096, required=False, allow_null=True)
    group_threshold = serializers.DecimalField(**SHARE, required=False, allow_null=True,
                                               min_value=Decimal("0.001"), max_value=Decimal("1"))
    max_duration_s = serializers.IntegerField(min_value=60, max_value=30 * 86400, required=False, allow_null=True)
    remote_allowed = serializers.BooleanField(
        required=False, default=False,
        help_text="May run on a share of a GPU on another node, if the team's policy allows remote shares")
    app = serializers.ChoiceField(
        choices=AppKind.choices, required=False, allow_blank=True, default="",
        help_text="An app the portal opens at /connect/<id>/ (its Open button): jupyter, vscode, tensorboard or port")
    app_port = serializers.IntegerField(min_value=1024, max_value=65535, required=False, allow_null=True,
                                        help_text="Where the app listens in the pod; blank: the app's default")
    # Blank until the reservation is placed: the schema's enum says so (a read-only model field
    # would otherwise lose allow_blank, and pending reservations answer a value outside the enum).
    sharing = serializers.ChoiceField(choices=Sharing.choices, read_only=True, allow_blank=True,
                                      help_text="How the placement shares its GPU; blank while not placed")
    client_node = serializers.CharField(source="client_node.name", read_only=True, default=None, allow_null=True,
                                        help_text="Where the pod of a remote share runs (its GPU is on `node`)")
    allocations = serializers.SerializerMethodField()
    opportunistic = serializers.BooleanField(
        read_only=True, help_text="Admitted as opportunistic (admission = opportunistic): kept for older clients")
    starts_at = serializers.DateTimeField(
        required=False, allow_null=True,
        help_text="Book ahead: the window's start (ISO 8601, in the future, at most 90 days ahead), with "
                  "`ends_at` or `duration_s`; the answer is `booked` until then")
    ends_at = serializers.DateTimeField(required=False, allow_null=True,
                                        help_text="A booking's window end; the placed reservation ends then")
    duration_s = serializers.IntegerField(
        write_only=True, required=False, min_value=60, max_value=30 * 86400,
        help_text="A booking's length in seconds, instead of `ends_at`")
    repeat_weeks = serializers.IntegerField(
        write_only=True, required=False, min_value=1, max_value=12,
        help_text="Book the same window weekly, this many times in all (1 to 12); the answer is the first")

    class Meta:
        model = Reservation
        list_serializer_class = ReservationListSerializer
        fields = [
            "id", "name", "team", "owner", "kind", "image", "command",
            "gpu_request", "gpu_limit", "gpu_memory_mib", "gpu_count", "gpu_model", "priority",
            "admission", "opportunistic", "reclaim_at", "requeue_on_preempt", "affinity", "anti_affinity",
            "exclusion", "group_name", "group_headcount", "group_threshold", "max_duration_s", "expires_at",
            "state", "state_reason", "node", "allocations", "starts_at", "ends_at", "duration_s", "repeat_weeks",
            "booking_series", "remote_allowed", "sharing", "sharing_reason", "client_node", "app", "app_port",
            "created_at", "placed_at", "started_at", "finished_at", "updated_at",
            "source", "pod_name", "queue_position", "estimated_start", "expiry_warned_at", "idle_since",
        ]
        read_only_fields = [
            "id", "owner", "admission", "opportunistic", "reclaim_at", "expires_at", "state", "state_reason", "node",
            "booking_series",
            "sharing", "sharing_reason", "client_node",
            "created_at", "placed_at", "started_at", "finished_at", "updated_at",
            "source", "pod_name", "queue_position", "estimated_start", "expiry_warned_at", "idle_since",
        ]
        extra_kwargs = {
            "name": {"required": False, "allow_blank": True},
            "affinity": {"required": False, "allow_blank": True},
            "anti_affinity": {"required": False, "allow_blank": True},
            "exclusion": {"required": False, "allow_blank": True},
            "group_name": {"required": False, "allow_blank": True},
        }

    def validate_gpu_model(self, value: str) -> str:
        return display_model(value)  # "NVIDIA-A100-SXM4-80GB" (label-safe) is "NVIDIA A100-SXM4-80GB"

    def to_representation(self, instance):
        reservation_related.attach([instance])  # (a list attaches all its items at once)
        return super().to_representation(instance)

    def get_allocations(self, obj) -> list[dict]:
        reservation_related.attach([obj])
        return [represent(AllocationSerializer, a) for a in obj.live_allocations]


class BookingWindowSerializer(StrictTypesMixin, serializers.Serializer):
    starts_at = serializers.DateTimeField(help_text="The window's new start (in the future, at most 90 days ahead)")
    ends_at = serializers.DateTimeField(help_text="The window's new end")


class FreeWindowSerializer(serializers.Serializer):
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()


class BookingConflictSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="The window and what is taken then")
    code = serializers.CharField()
    free_windows = FreeWindowSerializer(many=True, help_text="The nearest free windows of the same length")


class BookingSerializer(serializers.ModelSerializer):
    team = serializers.CharField(source="team.slug")
    owner = serializers.CharField(source="owner.username")
    gpu_request = serializers.DecimalField(**SHARE)

    class Meta:
        model = Reservation
        fields = ["id", "team", "owner", "name", "state", "starts_at", "ends_at", "booking_series", "gpu_model",
                  "gpu_request", "gpu_count", "gpu_memory_mib"]


class BookedModelSerializer(serializers.Serializer):
    gpu_model = serializers.CharField()
    gpus = serializers.IntegerField(help_text="The model's GPUs in the fleet")
    memory_gib = serializers.IntegerField()
    peak_gpu_share = serializers.DecimalField(max_digits=8, decimal_places=3, coerce_to_string=False,
                                              help_text="The most compute booked at once (whole GPUs count 1.0)")
    peak_memory_gib = serializers.IntegerField()
    peak_gpus = serializers.IntegerField()


class PlannedDrainDipSerializer(serializers.Serializer):
    id = serializers.IntegerField(source="plan", help_text="The planned drain")
    node = serializers.CharField()
    gpu_model = serializers.CharField()
    gpus = serializers.IntegerField(source="out", help_text="The model's GPUs on the node, out over the window")
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField(allow_null=True, help_text="null: until a person returns the node")
    reason = serializers.CharField()


class BookingsAnswerSerializer(serializers.Serializer):
    # `from` is a Python keyword: declared through the class namespace.
    vars()["from"] = serializers.DateTimeField()
    to = serializers.DateTimeField()
    models = BookedModelSerializer(many=True, help_text="Per GPU model: its cards and the peak of the bookings "
                                                        "listed (those you may see)")
    bookings = BookingSerializer(many=True)
    drains = PlannedDrainDipSerializer(many=True, help_text="Planned drains meeting the span, per GPU model of their "
                                                           "node (site admins and team managers; empty for others)")


class BookingsQuerySerializer(serializers.Serializer):
    gpu_model = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    vars()["from"] = serializers.DateTimeField(required=False, help_text="Default: now")
    to = serializers.DateTimeField(required=False, help_text="Default: four weeks after `from`; at most 92 days")
    # "true" or "false" only: a boolean query parameter written any other way is a client's mistake.
    mine = serializers.ChoiceField(choices=["true", "false"], required=False, default="false",
                                   help_text="true: only your own bookings")

    def validate(self, attrs):
        from datetime import timedelta

        from django.utils import timezone

        from portal.reservations.booking_calendar import LONGEST_SPAN

        start = attrs.get("from") or timezone.now()
        try:
            end = attrs.get("to") or start + timedelta(days=28)
        except OverflowError:
            raise serializers.ValidationError({"from": ["too far ahead"]}) from None
        if end <= start:
            raise serializers.ValidationError({"to": ["must be after from"]})
        if end - start > LONGEST_SPAN:
            raise serializers.ValidationError({"to": [f"at most {LONGEST_SPAN.days} days after from"]})
        return attrs | {"from": start, "to": end}

    def validate_gpu_model(self, value: str) -> str:
        return display_model(value)


class StateTransitionSerializer(serializers.ModelSerializer):
    class Meta:
        model = StateTransition
        fields = ["from_state", "to_state", "actor_label", "reason", "at"]


class VisibleDepartmentField(SafeSlugRelatedField):
    """A department given by slug, among those the user may see (others read as unknown)."""

    default_error_messages = {
        "does_not_exist": "no department '{value}'",
        "invalid": "must be a department slug, or null",
    }

    def __init__(self, **kwargs):
        super().__init__(slug_field="slug", **kwargs)

    def run_validation(self, data=serializers.empty):
        if data == "":  # DRF would read it as null; the schema (and this field) say a slug or null
            self.fail("invalid")
        return super().run_validation(data)

    def get_queryset(self):
        return departments.visible_departments(self.context["request"].user)


DEPRECATED = "Deprecated: {}, from the team's `*` quota row (every GPU model without a row of its own); " \
             "read and write quotas per model at /api/v1/teams/{{slug}}/quotas/."


# The flat quota of before departments: still read and written, as the team's `*` quota row.
@extend_schema_field({"type": "number", "format": "double", "minimum": 0, "maximum": 100000, "deprecated": True})
class DeprecatedShareField(serializers.DecimalField):
    pass


@extend_schema_field({"type": "integer", "minimum": 0, "maximum": 10**12, "deprecated": True})
class DeprecatedMemoryField(serializers.IntegerField):
    pass


@extend_schema_field({"type": "integer", "minimum": 0, "maximum": 1_000_000, "deprecated": True})
class DeprecatedGpusField(serializers.IntegerField):
    pass


class TeamListSerializer(serializers.ListSerializer):
    """Reads every listed team's quota rows and department in one query each."""

    def to_representation(self, data):
        items = list(data.all() if isinstance(data, BaseManager) else data)
        prefetch_related_objects(items, "quotas", "department")
        return super().to_representation(items)


class TeamSerializer(StrictTypesMixin, serializers.ModelSerializer):
    department = VisibleDepartmentField(
        required=False, allow_null=True,
        help_text="The slug of the department the team is in; null: directly under the organisation")
    quota_gpu_share = DeprecatedShareField(
        max_digits=8, decimal_places=3, coerce_to_string=False, min_value=Decimal("0"), max_value=Decimal("100000"),
        required=False, help_text=DEPRECATED.format("the guaranteed GPU share (whole GPUs count 1.0)"))
    quota_memory_mib = DeprecatedMemoryField(
        min_value=0, max_value=10**12, required=False,
        help_text=DEPRECATED.format("the guaranteed GPU memory in MiB (its gpu_memory_gib × 1024)"))
    quota_max_gpus = DeprecatedGpusField(
        min_value=0, max_value=1_000_000, required=False,
        help_text=DEPRECATED.format("how many GPUs the team holds at once (its gpus)"))
    my_role = serializers.SerializerMethodField()
    in_use = serializers.SerializerMethodField()

    class Meta:
        model = Team
        list_serializer_class = TeamListSerializer
        fields = ["slug", "name", "department", "quota_gpu_share", "quota_memory_mib", "quota_max_gpus",
                  "allow_over_quota", "my_role", "in_use", "created_at"]
        read_only_fields = ["created_at"]

    def to_representation(self, instance):
        # The three quota fields: one query, none where the list's queryset prefetched them already
        # (prefetch_related_objects skips what is fetched).
        prefetch_related_objects([instance], "quotas")
        return super().to_representation(instance)

    def get_my_role(self, obj) -> str | None:
        return roles.role_in(self.context["request"].user, obj)

    def get_in_use(self, obj) -> dict:
        from portal.reservations.quota import usage_of

        return usage_of(obj).as_dict()


class ExclusionGroupSerializer(StrictTypesMixin, serializers.ModelSerializer):
    team = VisibleTeamField()

    class Meta:
        model = ExclusionGroup
        fields = ["id", "team", "label", "description", "created_at"]
        read_only_fields = ["id", "created_at"]
        validators = []  # uniqueness is checked by portal.tenancy.groups with a clearer message


class GpuSerializer(serializers.ModelSerializer):
    """allocated_*: what your teams hold on the GPU (every team's, for site admins)."""

    node = serializers.CharField(source="node.name", read_only=True)
    allocated_request = serializers.DecimalField(max_digits=6, decimal_places=3, coerce_to_string=False,
                                                 read_only=True)
    allocated_memory_mib = serializers.IntegerField(read_only=True)

    class Meta:
        model = Gpu
        fields = ["uuid", "node", "index", "model", "model_label", "memory_mib", "nvlink_peers", "numa_node",
                  "healthy", "allocated_request", "allocated_memory_mib", "cordoned", "cordon_reason"]


class NodeSerializer(serializers.ModelSerializer):
    gpu_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Node
        fields = ["name", "labels", "status", "status_reason", "cpu_milli", "memory_mib", "last_seen",
                  "gpu_count", "created_at"]


class NodeActionSerializer(StrictTypesMixin, serializers.Serializer):
    reason = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class TokenSerializer(StrictTypesMixin, serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
        read_only_fields = ["id", "prefix", "created_at", "last_used_at", "revoked_at"]


TOKEN_NAME_HELP = ("what the token is for (e.g. laptop, ci); one live token per name: the same name again "
                   "is refused (409) unless `replace` is true, which revokes the old one")


class NewTokenRequestSerializer(StrictTypesMixin, serializers.Serializer):
    name = serializers.CharField(max_length=80, help_text=TOKEN_NAME_HELP, error_messages={
        "required": "give the token a name (e.g. laptop or ci): your tokens are listed by name",
        "blank": "give the token a name (e.g. laptop or ci): your tokens are listed by name",
        "max_length": "a token name has at most 80 characters"})
    replace = serializers.BooleanField(required=False, default=False,
                                       help_text="revoke your live token of this name and make a new one")


class NewTokenSerializer(TokenSerializer):
    key = serializers.CharField(read_only=True, help_text="Shown once; only its hash is stored.")
    replaced = serializers.SerializerMethodField(
        help_text="the prefix of the token of the same name this one replaced (now revoked), or null")

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "key", "replaced"]

    def get_replaced(self, token) -> str | None:
        replaced = getattr(token, "replaced", None)
        return replaced.prefix if replaced is not None else None


class TokenRequestSerializer(NewTokenRequestSerializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=4096, style={"input_type": "password"}, trim_whitespace=False)


# A capacity answer lists the best GPUs, not all of them: at 500 nodes × 8 GPUs the whole list
# was 4,000 entries (590 kB) per preview, most of the preview's time, and nobody reads past the top.
DEFAULT_CAPACITY_GPUS = 100
MAX_CAPACITY_GPUS = 1000


class CapacityQuerySerializer(serializers.Serializer):
    gpu_request = serializers.DecimalField(**SHARE, min_value=Decimal("0.001"), max_value=Decimal("1"))
    gpu_memory_mib = serializers.IntegerField(min_value=1, max_value=10_000_000)
    gpu_model = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    gpu_count = serializers.IntegerField(min_value=1, max_value=64, default=1)
    team = serializers.CharField(max_length=50, required=False, allow_blank=True, default="")
    priority = serializers.IntegerField(min_value=0, max_value=100, default=50,
                                        help_text="with a team: 0 may run opportunistically beyond its quota")
    exclusion = serializers.CharField(max_length=63, required=False, allow_blank=True, default="",
                                      help_text="one of the team's exclusion groups (needs `team`)")
    affinity = serializers.CharField(max_length=63, required=False, allow_blank=True, default="")
    anti_affinity = serializers.CharField(max_length=63, required=False, allow_blank=True, default="")
    limit = serializers.IntegerField(min_value=1, max_value=MAX_CAPACITY_GPUS, default=DEFAULT_CAPACITY_GPUS,
                                     help_text="the most GPUs to list, best first (`count` says how many fit)")

    def validate_gpu_model(self, value: str) -> str:
        return display_model(value)


class CapacityGpuSerializer(serializers.Serializer):
    uuid = serializers.CharField()
    node = serializers.CharField()
    index = serializers.IntegerField()
    model = serializers.CharField()
    free_share = serializers.FloatField()
    free_memory_mib = serializers.IntegerField()


class CapacityAnswerSerializer(serializers.Serializer):
    gpus = CapacityGpuSerializer(many=True, help_text="the best `limit` of the GPUs that could take it")
    count = serializers.IntegerField(help_text="how many GPUs could take it")
    fits = serializers.BooleanField()
    admission = serializers.ChoiceField(
        choices=["guaranteed", "borrowed", "opportunistic"], allow_null=True,
        help_text="with a team: how it would count against quotas if it started now (null: it would wait)")
    never = serializers.BooleanField(help_text="it can never run as asked (beyond a hard limit): submit refuses it")
    reasons = serializers.ListField(child=serializers.DictField())
