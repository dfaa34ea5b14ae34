"""Nodes and GPUs in Django's admin: read-only (fleet.services writes them, with the audit row, the
placement cycle's wake-up and the pushes); draining and cordoning are actions that call it."""

from django.contrib import admin

from portal.audit import services as audit
from portal.audit.admin import ServiceWrittenAdmin

from . import services
from .models import Gpu, Node


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    can_delete = False
    fields = ("index", "uuid", "model", "memory_mib", "healthy", "cordoned", "cordon_reason")

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Node)
class NodeAdmin(ServiceWrittenAdmin):
    list_display = ("name", "status", "last_seen", "cpu_milli", "memory_mib", "address")
    list_filter = ("status",)
    search_fields = ("name",)
    exclude = ("agent_token_hash",)
    inlines = [GpuInline]
    actions = ["drain_selected", "undrain_selected"]

    @admin.action(description="Drain the selected nodes (no new placements)", permissions=["operate"])
    def drain_selected(self, request, queryset):
        for node_id in queryset.values_list("pk", flat=True):
            services.drain(node_id, audit.web(request.user), "drained in Django admin")
        self.message_user(request, f"{queryset.count()} node(s) draining.")

    @admin.action(description="Make the selected nodes ready again", permissions=["operate"])
    def undrain_selected(self, request, queryset):
        for node_id in queryset.values_list("pk", flat=True):
            services.undrain(node_id, audit.web(request.user))
        self.message_user(request, f"{queryset.count()} node(s) ready.")


@admin.register(Gpu)
class GpuAdmin(ServiceWrittenAdmin):
    list_display = ("uuid", "node", "index", "model", "memory_mib", "numa_node", "healthy", "cordoned")
    list_filter = ("model", "healthy", "cordoned")
    search_fields = ("uuid", "node__name")
    actions = ["cordon_selected", "uncordon_selected"]

    @admin.action(description="Cordon the selected GPUs (no new shares)", permissions=["operate"])
    def cordon_selected(self, request, queryset):
        by = audit.web(request.user)
        for gpu_id in queryset.values_list("pk", flat=True):
            services.set_cordon(gpu_id, by, True, f"cordoned in Django admin by {by.label}")
        self.message_user(request, f"{queryset.count()} GPU(s) cordoned.")

    @admin.action(description="Uncordon the selected GPUs", permissions=["operate"])
    def uncordon_selected(self, request, queryset):
        for gpu_id in queryset.values_list("pk", flat=True):
            services.set_cordon(gpu_id, audit.web(request.user), False)
        self.message_user(request, f"{queryset.count()} GPU(s) uncordoned.")
