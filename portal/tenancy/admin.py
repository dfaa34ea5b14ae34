from django.contrib import admin

from .models import ApiToken, ExclusionGroup, Membership, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


class ExclusionGroupInline(admin.TabularInline):
    model = ExclusionGroup
    extra = 0


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "quota_gpu_share", "quota_memory_mib", "quota_max_gpus", "allow_over_quota")
    search_fields = ("slug", "name")
    inlines = [MembershipInline, ExclusionGroupInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "team", "role", "created_at")
    list_filter = ("role", "team")


@admin.register(ExclusionGroup)
class ExclusionGroupAdmin(admin.ModelAdmin):
    list_display = ("team", "label", "description")
    list_filter = ("team",)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("user", "name", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at")
    list_filter = ("revoked_at",)
