from django.contrib import admin

from portal.audit.admin import AuditedAdmin

from .models import Gpu, Node


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0


@admin.register(Node)
class NodeAdmin(AuditedAdmin):
    list_display = ("name", "status", "last_seen", "cpu_milli", "memory_mib", "address")
    list_filter = ("status",)
    search_fields = ("name",)
    readonly_fields = ("agent_token_hash", "agent_token_created_at", "last_seen")
    inlines = [GpuInline]


@admin.register(Gpu)
class GpuAdmin(AuditedAdmin):
    list_display = ("uuid", "node", "index", "model", "memory_mib", "numa_node", "healthy", "cordoned")
    list_filter = ("model", "healthy", "cordoned")
    search_fields = ("uuid", "node__name")
