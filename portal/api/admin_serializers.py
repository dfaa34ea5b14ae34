"""API shapes of the admin operations: members, groups and labels, presets, policy, departments,
quotas, fleet actions and the audit log. The rules are the services' (portal.tenancy, portal.fleet);
these only check types and pass the values on."""

from __future__ import annotations

from decimal import Decimal

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.audit.models import AuditEntry
from portal.tenancy import policy
from portal.tenancy.models import AffinityLabel, Department, Membership, Preset, Role

from .serializers import SHARE, VisibleTeamField
from .strict import StrictTypesMixin


class MemberSerializer(StrictTypesMixin, serializers.ModelSerializer):
    """A membership; `user` is given as a username or an e-mail address."""

    team = VisibleTeamField()
    user = serializers.CharField(max_length=254, help_text="Username or e-mail address")
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)
    default_exclusion = serializers.CharField(source="default_exclusion.label", read_only=True, default=None,
                                              allow_null=True)
    default_affinity = serializers.CharField(source="default_affinity.label", read_only=True, default=None,
                                             allow_null=True)
    effect = serializers.SerializerMethodField()

    class Meta:
        model = Membership
        fields = ["id", "team", "user", "role", "default_exclusion", "default_affinity", "effect", "created_at"]
        read_only_fields = ["id", "created_at"]

    def to_representation(self, instance):
        data = super().to_representation(instance)
        data["user"] = instance.user.username
        return data

    def get_effect(self, obj) -> str:
        from portal.tenancy.members import effect_of

        return effect_of(obj.role, obj.user.username, obj.team)


class MemberUpdateSerializer(StrictTypesMixin, serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices, required=False)
    default_exclusion = serializers.CharField(max_length=63, required=False, allow_blank=True, allow_null=True)
    default_affinity = serializers.CharField(max_length=63, required=False, allow_blank=True, allow_null=True)


class AffinityLabelSerializer(StrictTypesMixin, serializers.ModelSerializer):
    team = VisibleTeamField()

    class Meta:
        model = AffinityLabel
        fields = ["id", "team", "label", "description", "created_at"]
        read_only_fields = ["id", "created_at"]
        validators = []  # the service checks uniqueness with a clearer message


class GroupChangeSerializer(StrictTypesMixin, serializers.Serializer):
    label = serializers.CharField(max_length=63, required=False)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)


class PreviewSerializer(serializers.Serializer):
    label = serializers.CharField()
    kind = serializers.CharField()
    lines = serializers.ListField(child=serializers.CharField())
    can_land = serializers.IntegerField()
    cannot_land = serializers.IntegerField()
    more = serializers.IntegerField()


class PresetSerializer(StrictTypesMixin, serializers.ModelSerializer):
    team = VisibleTeamField()
    gpu_request = serializers.DecimalField(**SHARE, min_value=Decimal("0.001"), max_value=Decimal("1"))
    gpu_limit = serializers.DecimalField(**SHARE, min_value=Decimal("0.001"), max_value=Decimal("1"),
                                         required=False, allow_null=True)
    gpu_memory_mib = serializers.IntegerField(min_value=1, max_value=10_000_000)
    max_duration_s = serializers.IntegerField(min_value=60, max_value=30 * 86400, required=False, allow_null=True)
    command = serializers.ListField(child=serializers.CharField(max_length=4096, allow_blank=True),
                                    max_length=256, required=False, default=list)

    class Meta:
        model = Preset
        fields = ["id", "team", "name", "kind", "gpu_model", "gpu_request", "gpu_limit", "gpu_memory_mib",
                  "max_duration_s", "image", "command", "created_at", "updated_at"]
        read_only_fields = ["id", "created_at", "updated_at"]
        validators = []
        extra_kwargs = {"gpu_model": {"required": False, "allow_blank": True}}


def _setting(name: str, **kwargs) -> serializers.Field:
    """A policy or limit field with the range the policy service allows, stated in the schema and
    refused in the service's words; optional, as in a PATCH, unless `required=True` is given."""
    if name in policy.FRACTIONS:
        low, high = Decimal(0), Decimal(1)
        field, defaults = serializers.DecimalField, {"max_digits": 4, "decimal_places": 3, "coerce_to_string": False}
    else:
        (low, high), field = policy.WHOLE_NUMBERS[name], serializers.IntegerField
        defaults = {"allow_null": name in policy.NO_LIMIT_WHEN_BLANK}
    message = policy.out_of_range(low, high)
    return field(**{"required": False, "min_value": low, "max_value": high,
                    "error_messages": {"min_value": message, "max_value": message}} | defaults | kwargs)


class PolicySerializer(StrictTypesMixin, serializers.Serializer):
    """What team admins set (PATCH any subset); GET adds the site admins' limits."""

    max_duration_s = _setting("max_duration_s", help_text="Longest a member may ask for; null: the site limit")
    interactive_max_s = _setting("interactive_max_s", help_text="Default duration of interactive ones")
    idle_threshold = _setting("idle_threshold", help_text="Using less than this fraction of a GPU counts as idle")
    idle_after_s = _setting("idle_after_s")
    idle_reclaim = serializers.BooleanField(required=False, help_text="false: warn only")
    idle_warning_s = _setting("idle_warning_s", help_text="Warned this long before the reclaim")
    max_priority_member = _setting("max_priority_member")
    max_priority_admin = _setting("max_priority_admin")
    allow_over_quota = serializers.BooleanField(required=False)
    allow_remote = serializers.BooleanField(required=False, help_text="Requests may use a share of another node's GPU")
    reclaim_grace_s = _setting(
        "reclaim_grace_s", help_text="Seconds a borrowed reservation runs on once warned it will be reclaimed")
    booking_no_show_min = _setting(
        "booking_no_show_min", help_text="Minutes a started booking may go without a process on its GPU before "
        "it is released")
    connect_admins = serializers.BooleanField(
        required=False, help_text="Team admins may open the apps (Open) of the team's reservations")


class PolicyLimitsAnswerSerializer(serializers.Serializer):
    duration_s = _setting("limit_duration_s", required=True)
    priority = _setting("limit_priority", required=True)
    idle_after_s = _setting("limit_idle_after_s", required=True)
    idle_threshold = _setting("limit_idle_threshold", required=True, coerce_to_string=True)
    require_reclaim = serializers.BooleanField()
    idle_warning_s = _setting("limit_idle_warning_s", required=True)
    allow_over_quota = serializers.BooleanField()


class PolicyAnswerSerializer(serializers.Serializer):
    """What GET and PATCH answer (policy.Policy.as_dict): the policy in force, with its limits."""

    max_duration_s = _setting("max_duration_s", required=True, allow_null=False)
    interactive_max_s = _setting("interactive_max_s", required=True)
    idle_threshold = _setting("idle_threshold", required=True, coerce_to_string=True)
    idle_after_s = _setting("idle_after_s", required=True)
    idle_reclaim = serializers.BooleanField()
    idle_warning_s = _setting("idle_warning_s", required=True)
    max_priority_member = _setting("max_priority_member", required=True)
    max_priority_admin = _setting("max_priority_admin", required=True)
    allow_over_quota = serializers.BooleanField()
    limits = PolicyLimitsAnswerSerializer()
    allow_remote = serializers.BooleanField()
    reclaim_grace_s = _setting("reclaim_grace_s", required=True)
    booking_no_show_min = _setting("booking_no_show_min", required=True)
    connect_admins = serializers.BooleanField()


class LimitsSerializer(StrictTypesMixin, serializers.Serializer):
    limit_duration_s = _setting("limit_duration_s")
    limit_priority = _setting("limit_priority")
    limit_idle_after_s = _setting("limit_idle_after_s", help_text="null: no limit")
    limit_idle_warning_s = _setting("limit_idle_warning_s", help_text="null: no limit")
    limit_idle_threshold = _setting("limit_idle_threshold")
    limit_require_reclaim = serializers.BooleanField(required=False)
    limit_allow_over_quota = serializers.BooleanField(required=False)


class DepartmentSlugField(serializers.CharField):
    """A department by its slug (null: the organisation); the service says when there is none."""

    def to_representation(self, value):
        return value.slug


class DepartmentSerializer(StrictTypesMixin, serializers.ModelSerializer):
    """A department: site admins create, rename, move (`parent`) and delete them; everyone sees the
    departments their teams are under."""

    slug = serializers.CharField(max_length=50, help_text="Short name: lowercase letters, digits and '-'")
    name = serializers.CharField(max_length=120)
    parent = DepartmentSlugField(max_length=50, allow_null=True, default=None,
                                 help_text="The slug of the department above it; null: directly under the "
                                           "organisation. Departments nest at most 4 levels deep.")

    class Meta:
        model = Department
        fields = ["slug", "name", "parent", "created_at"]
        read_only_fields = ["created_at"]
        validators = []  # the service checks the slug with a clearer message


class DepartmentChangeSerializer(StrictTypesMixin, serializers.Serializer):
    name = serializers.CharField(max_length=120, required=False)
    parent = serializers.CharField(max_length=50, required=False, allow_null=True,
                                   help_text="The slug of the department above it; null: the organisation")


def _amount(integer_digits: int, maximum: str, exclusive_zero: bool = False) -> dict:
    number = {"type": "number", "minimum": 0, "maximum": float(maximum)}
    if exclusive_zero:
        number["exclusiveMinimum"] = True
    return {"oneOf": [number, {"type": "string", "pattern": rf"^[0-9]{{1,{integer_digits}}}(\.[0-9]{{1,3}})?$"}]}


# Requests give amounts as JSON numbers or decimal strings; answers give decimal strings.
@extend_schema_field(_amount(6, "100000"))
class ShareAmountField(serializers.DecimalField):
    def __init__(self, **kwargs):
        super().__init__(max_digits=10, decimal_places=3, **kwargs)


@extend_schema_field(_amount(9, "999999999.999"))
class MemoryAmountField(serializers.DecimalField):
    def __init__(self, **kwargs):
        super().__init__(max_digits=12, decimal_places=3, **kwargs)


@extend_schema_field(_amount(4, "1000", exclusive_zero=True))
class WeightField(serializers.DecimalField):
    def __init__(self, **kwargs):
        super().__init__(max_digits=8, decimal_places=3, **kwargs)


class QuotaLimitInputSerializer(StrictTypesMixin, serializers.Serializer):
    gpu_share = ShareAmountField(required=False, allow_null=True)
    gpu_memory_gib = MemoryAmountField(required=False, allow_null=True)
    gpus = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=10**6)


class QuotaRowInputSerializer(StrictTypesMixin, serializers.Serializer):
    """One bucket's quota: a GPU model of the fleet, or `*` for every model without a row of its own."""

    gpu_model = serializers.CharField(max_length=100, help_text="A GPU model of the fleet, or * for any other model")
    gpu_share = ShareAmountField(help_text="Guaranteed compute, whole GPUs counting 1.0 each")
    gpu_memory_gib = MemoryAmountField(help_text="Guaranteed GPU memory, GiB")
    gpus = serializers.IntegerField(min_value=0, max_value=10**6,
                                    help_text="GPUs held at once (a share of one GPU counts 1)")
    borrowing_limit = QuotaLimitInputSerializer(
        required=False, allow_null=True,
        help_text="The most beyond its quota it may borrow, per resource; null (or a null value): unlimited")
    lending_limit = QuotaLimitInputSerializer(
        required=False, allow_null=True,
        help_text="The most of its unused quota others may borrow, per resource (at most the quota); null: all of it")
    weight = WeightField(required=False, help_text="Its share of what is left over, against its siblings' (default 1)")


class QuotaLimitSerializer(serializers.Serializer):
    gpu_share = serializers.DecimalField(max_digits=10, decimal_places=3, allow_null=True)
    gpu_memory_gib = serializers.DecimalField(max_digits=12, decimal_places=3, allow_null=True)
    gpus = serializers.IntegerField(allow_null=True)


class QuotaRowSerializer(serializers.Serializer):
    """One bucket's quota as stored (decimals as strings; null limits: unlimited)."""

    gpu_model = serializers.CharField()
    gpu_share = serializers.DecimalField(max_digits=10, decimal_places=3)
    gpu_memory_gib = serializers.DecimalField(max_digits=12, decimal_places=3)
    gpus = serializers.IntegerField()
    borrowing_limit = QuotaLimitSerializer(allow_null=True)
    lending_limit = QuotaLimitSerializer(allow_null=True)
    weight = serializers.DecimalField(max_digits=8, decimal_places=3)


class GpuActionSerializer(StrictTypesMixin, serializers.Serializer):
    reason = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class NodeTokenSerializer(serializers.Serializer):
    node = serializers.CharField()
    key = serializers.CharField(help_text="Shown once; only its hash is stored.")
    created_at = serializers.DateTimeField()


class AuditEntrySerializer(serializers.ModelSerializer):
    team = serializers.CharField(source="team.slug", read_only=True, default=None, allow_null=True)
    actor = serializers.CharField(source="actor_label", read_only=True)

    class Meta:
        model = AuditEntry
        fields = ["id", "at", "actor", "via", "team", "object_type", "object_id", "object_repr", "action",
                  "before", "after", "message"]


class PlannedDrainInputSerializer(StrictTypesMixin, serializers.Serializer):
    starts_at = serializers.DateTimeField(help_text="When the node is drained: now or later, ≤ 90 days ahead "
                                                    "(ISO 8601 with its time zone)")
    ends_at = serializers.DateTimeField(required=False, allow_null=True, default=None,
                                        help_text="When it is ready again (≤ 30 days after the start); "
                                                  "null or absent: until a person returns it")
    reason = serializers.CharField(max_length=1000, help_text="Why, shown on the node, the calendar and to "
                                                              "booking owners (≤ 200 characters)")
    force = serializers.BooleanField(required=False, default=False,
                                     help_text="Plan it even where it breaks bookings (their owners are told)")


class PlannedDrainSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    node = serializers.CharField(source="node.name")
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField(allow_null=True)
    reason = serializers.CharField()
    state = serializers.CharField(help_text="planned, active (draining the node now), ended or cancelled")
    applied = serializers.BooleanField(help_text="The plan drained the node (it was not drained already)")
    end_note = serializers.CharField(help_text="How it ended or was cancelled")
    created_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(allow_null=True)


class DrainConflictBookingSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    team = serializers.CharField()
    owner = serializers.CharField()
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()


class DrainConflictSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="The window and the bookings it would break")
    code = serializers.CharField()
    bookings = DrainConflictBookingSerializer(many=True)
