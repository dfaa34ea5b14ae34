from django.contrib import admin

from .models import AuditEntry


class ServiceWrittenAdmin(admin.ModelAdmin):
    """Rows that a service writes (reservations, allocations, their audit rows, nodes, GPUs, every
    tenancy row) are shown here and never edited: an edit in the admin would skip the service's
    checks, locks, audit rows and pushes. Changes go through admin actions, which call the service."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    # The actions (cancel, drain, cordon …) are for superusers: `permissions=["operate"]`.
    def has_operate_permission(self, request):
        return request.user.is_superuser


@admin.register(AuditEntry)
class AuditEntryAdmin(ServiceWrittenAdmin):
    list_display = ("at", "actor_label", "via", "team", "object_type", "object_repr", "action")
    list_filter = ("via", "object_type", "team")
    search_fields = ("object_repr", "actor_label", "message")
