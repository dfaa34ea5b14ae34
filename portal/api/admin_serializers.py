"""API shapes of the admin operations: members, groups and labels, presets, policy, quotas,
fleet actions and the audit log. The rules are the services' (portal.tenancy, portal.fleet);
these only check types and pass the values on."""

from __future__ import annotations

from decimal import Decimal

from rest_framework import serializers

from portal.audit.models import AuditEntry
from portal.tenancy.models import AffinityLabel, Membership, Preset, Role

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


class PolicySerializer(StrictTypesMixin, serializers.Serializer):
    """What team admins set (PATCH any subset); GET adds the site admins' limits."""

    max_duration_s = serializers.IntegerField(required=False, allow_null=True)
    interactive_max_s = serializers.IntegerField(required=False, help_text="Default duration of interactive ones")
    idle_threshold = serializers.DecimalField(max_digits=4, decimal_places=3, coerce_to_string=False, required=False)
    idle_after_s = serializers.IntegerField(required=False)
    idle_reclaim = serializers.BooleanField(required=False, help_text="false: warn only")
    idle_warning_s = serializers.IntegerField(required=False, help_text="Warned this long before the reclaim")
    max_priority_member = serializers.IntegerField(required=False)
    max_priority_admin = serializers.IntegerField(required=False)
    allow_over_quota = serializers.BooleanField(required=False)
    allow_remote = serializers.BooleanField(required=False, help_text="Requests may use a share of another node's GPU")


class LimitsSerializer(StrictTypesMixin, serializers.Serializer):
    limit_duration_s = serializers.IntegerField(required=False)
    limit_priority = serializers.IntegerField(required=False)
    limit_idle_after_s = serializers.IntegerField(required=False, allow_null=True)
    limit_idle_warning_s = serializers.IntegerField(required=False, allow_null=True)
    limit_idle_threshold = serializers.DecimalField(max_digits=4, decimal_places=3, coerce_to_string=False,
                                                    required=False)
    limit_require_reclaim = serializers.BooleanField(required=False)
    limit_allow_over_quota = serializers.BooleanField(required=False)


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
