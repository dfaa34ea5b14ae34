"""Tenancy in Django's admin: read-only. Every row here has a writer that checks what an admin form
would skip (quotas within their department's, a team's policy within its limits, what removing a
member or renaming a group does to the team's reservations) and asks for a placement cycle when
capacity may have changed; change them on the portal's pages or the API. The one change offered,
revoking API tokens, is an action that calls the token service."""

from django.contrib import admin

from portal.audit.admin import ServiceWrittenAdmin

from . import services
from .models import AffinityLabel, ApiToken, Department, ExclusionGroup, Membership, Preset, Quota, Team, TeamPolicy


class ReadOnlyInline(admin.TabularInline):
    extra = 0

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class MembershipInline(ReadOnlyInline):
    model = Membership


class ExclusionGroupInline(ReadOnlyInline):
    model = ExclusionGroup


class QuotaInline(ReadOnlyInline):
    model = Quota
    fields = ("gpu_model", "gpu_share", "gpu_memory_gib", "gpus", "weight")


@admin.register(Team)
class TeamAdmin(ServiceWrittenAdmin):
    list_display = ("slug", "name", "department", "quota_gpu_share", "quota_memory_mib", "quota_max_gpus",
                    "allow_over_quota")
    search_fields = ("slug", "name")
    inlines = [MembershipInline, ExclusionGroupInline, QuotaInline]


@admin.register(Department)
class DepartmentAdmin(ServiceWrittenAdmin):
    list_display = ("slug", "name", "parent", "created_at")
    search_fields = ("slug", "name")
    inlines = [QuotaInline]


@admin.register(Quota)
class QuotaAdmin(ServiceWrittenAdmin):
    list_display = ("__str__", "gpu_model", "gpu_share", "gpu_memory_gib", "gpus", "weight")
    list_filter = ("gpu_model",)


@admin.register(Membership)
class MembershipAdmin(ServiceWrittenAdmin):
    list_display = ("user", "team", "role", "created_at")
    list_filter = ("role", "team")


@admin.register(ExclusionGroup)
class ExclusionGroupAdmin(ServiceWrittenAdmin):
    list_display = ("team", "label", "description")
    list_filter = ("team",)


@admin.register(AffinityLabel)
class AffinityLabelAdmin(ServiceWrittenAdmin):
    list_display = ("team", "label", "description")
    list_filter = ("team",)


@admin.register(Preset)
class PresetAdmin(ServiceWrittenAdmin):
    list_display = ("team", "name", "kind", "gpu_model", "gpu_request", "gpu_memory_mib")
    list_filter = ("team",)


@admin.register(TeamPolicy)
class TeamPolicyAdmin(ServiceWrittenAdmin):
    list_display = ("team", "max_duration_s", "max_priority_member", "max_priority_admin", "reclaim_grace_s",
                    "limit_priority")


@admin.register(ApiToken)
class ApiTokenAdmin(ServiceWrittenAdmin):
    list_display = ("user", "name", "prefix", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    exclude = ("key_hash",)
    actions = ["revoke_selected"]

    @admin.action(description="Revoke the selected API tokens", permissions=["operate"])
    def revoke_selected(self, request, queryset):
        for token in queryset:
            services.revoke_token(token)
        self.message_user(request, f"{queryset.count()} token(s) revoked.")
