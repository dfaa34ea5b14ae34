from django.contrib import admin

from portal.audit.admin import AuditedAdmin

from .models import AffinityLabel, ApiToken, ExclusionGroup, Membership, Preset, Team, TeamPolicy


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


class ExclusionGroupInline(admin.TabularInline):
    model = ExclusionGroup
    extra = 0


@admin.register(Team)
class TeamAdmin(AuditedAdmin):
    list_display = ("slug", "name", "quota_gpu_share", "quota_memory_mib", "quota_max_gpus", "allow_over_quota")
    search_fields = ("slug", "name")
    inlines = [MembershipInline, ExclusionGroupInline]


@admin.register(Membership)
class MembershipAdmin(AuditedAdmin):
    list_display = ("user", "team", "role", "created_at")
    list_filter = ("role", "team")


@admin.register(ExclusionGroup)
class ExclusionGroupAdmin(AuditedAdmin):
    list_display = ("team", "label", "description")
    list_filter = ("team",)
    audit_type = "exclusion"


@admin.register(AffinityLabel)
class AffinityLabelAdmin(AuditedAdmin):
    list_display = ("team", "label", "description")
    list_filter = ("team",)
    audit_type = "affinity"


@admin.register(Preset)
class PresetAdmin(AuditedAdmin):
    list_display = ("team", "name", "kind", "gpu_model", "gpu_request", "gpu_memory_mib")
    list_filter = ("team",)


@admin.register(TeamPolicy)
class TeamPolicyAdmin(AuditedAdmin):
    list_display = ("team", "max_duration_s", "max_priority_member", "max_priority_admin", "limit_priority")
    audit_type = "policy"


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("user", "name", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at")
    list_filter = ("revoked_at",)
