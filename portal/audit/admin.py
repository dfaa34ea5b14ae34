from django.contrib import admin
from django.contrib.admin.models import ADDITION, CHANGE, DELETION

from . import services
from .models import AuditEntry

ACTIONS = {ADDITION: "created", CHANGE: "changed", DELETION: "deleted"}


class AuditedAdmin(admin.ModelAdmin):
    """Changes made in Django's admin pages land in the audit log too (via the browser)."""

    audit_type = ""

    def _audit(self, request, obj, flag: int, message: str) -> None:
        team = getattr(obj, "team", None) if obj.__class__.__name__ != "Team" else obj
        services.record(services.web(request.user), object_type=self.audit_type or obj._meta.model_name,
                        object_id=obj.pk, object_repr=str(obj), team=team, action=ACTIONS[flag],
                        message=f"in Django admin: {message}"[:500])

    def log_addition(self, request, obj, message):
        self._audit(request, obj, ADDITION, str(message))
        return super().log_addition(request, obj, message)

    def log_change(self, request, obj, message):
        self._audit(request, obj, CHANGE, str(message))
        return super().log_change(request, obj, message)

    def log_deletions(self, request, queryset):
        for obj in queryset:
            self._audit(request, obj, DELETION, "deleted")
        return super().log_deletions(request, queryset)


class ServiceWrittenAdmin(admin.ModelAdmin):
    """Rows that a service writes (reservations, allocations, their audit rows, nodes, GPUs) are
    shown here and never edited: an edit in the admin would skip the service's locks, audit rows
    and pushes. Changes go through admin actions, which call the service."""

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
