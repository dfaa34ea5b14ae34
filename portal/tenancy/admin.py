from django.contrib import admin

from portal.audit.admin import AuditedAdmin

from .models import AffinityLabel, ApiToken, Department, ExclusionGroup, Membership, Preset, Quota, Team, TeamPolicy


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


class ExclusionGroupInline(admin.TabularInline):
    model = ExclusionGroup
    extra = 0


class ReadOnlyAdmin(admin.ModelAdmin):
    """Shown, not edited: their writers check rules the admin forms would skip (children's quotas
    within their parent's, nesting depth); change them on the portal's pages or the API."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class QuotaInline(admin.TabularInline):
    model = Quota
    extra = 0
    fields = ("gpu_model", "gpu_share", "gpu_memory_gib", "gpus", "weight")

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Team)
class TeamAdmin(AuditedAdmin):
    list_display = ("slug", "name", "department", "quota_gpu_share", "quota_memory_mib", "quota_max_gpus",
                    "allow_over_quota")
    search_fields = ("slug", "name")
    readonly_fields = ("department",)  # moved by portal.tenancy.departments.move_team, which checks quotas
    inlines = [MembershipInline, ExclusionGroupInline, QuotaInline]

    def has_add_permission(self, request):
        # teams are made by portal.tenancy.teams.create_team (the fleet pages, the API): it gives
        # the team its `*` quota row and checks that its department can hold it
        return False


@admin.register(Department)
class DepartmentAdmin(ReadOnlyAdmin):
    list_display = ("slug", "name", "parent", "created_at")
    search_fields = ("slug", "name")
    inlines = [QuotaInline]


@admin.register(Quota)
class QuotaAdmin(ReadOnlyAdmin):
    list_display = ("__str__", "gpu_model", "gpu_share", "gpu_memory_gib", "gpus", "weight")
    list_filter = ("gpu_model",)


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
    list_display = ("team", "max_duration_s", "max_priority_member", "max_priority_admin", "reclaim_grace_s",
                    "limit_priority")
    audit_type = "policy"


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("user", "name", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at")
    list_filter = ("revoked_at",)
