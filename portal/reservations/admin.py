from django.contrib import admin

from .models import Allocation, Reservation, StateTransition


class AllocationInline(admin.TabularInline):
    model = Allocation
    extra = 0


class StateTransitionInline(admin.TabularInline):
    model = StateTransition
    extra = 0
    readonly_fields = ("from_state", "to_state", "actor", "actor_label", "reason", "at")
    can_delete = False


@admin.register(Reservation)
class ReservationAdmin(admin.ModelAdmin):
    list_display = ("id", "team", "owner", "kind", "gpu_request", "gpu_count", "gpu_model", "priority", "state")
    list_filter = ("state", "kind", "team")
    search_fields = ("id", "name", "owner__username")
    readonly_fields = ("state", "created_at", "placed_at", "started_at", "finished_at")
    inlines = [AllocationInline, StateTransitionInline]


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):
    list_display = ("reservation", "gpu", "gpu_request", "gpu_memory_mib", "created_at", "released_at")


@admin.register(StateTransition)
class StateTransitionAdmin(admin.ModelAdmin):
    list_display = ("reservation", "from_state", "to_state", "actor_label", "reason", "at")
    list_filter = ("to_state",)
