"""Reservations in Django's admin: read-only (the reservation services are their one writer); the
one change offered, cancelling, is an action that calls the service."""

from django.contrib import admin, messages

from portal.audit.admin import ServiceWrittenAdmin

from . import services
from .models import Allocation, Reservation, StateTransition
from .states import IllegalTransition


class AllocationInline(admin.TabularInline):
    model = Allocation
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class StateTransitionInline(AllocationInline):
    model = StateTransition


@admin.register(Reservation)
class ReservationAdmin(ServiceWrittenAdmin):
    list_display = ("id", "team", "owner", "kind", "gpu_request", "gpu_count", "gpu_model", "priority", "state")
    list_filter = ("state", "kind", "team")
    search_fields = ("id", "name", "owner__username")
    inlines = [AllocationInline, StateTransitionInline]
    actions = ["cancel_selected"]

    @admin.action(description="Cancel the selected reservations", permissions=["operate"])
    def cancel_selected(self, request, queryset):
        cancelled, refused = 0, []
        for reservation_id in queryset.values_list("pk", flat=True):
            try:
                _, changed = services.cancel(reservation_id, request.user, "cancelled in Django admin")
            except IllegalTransition as refusal:
                refused.append(f"#{reservation_id}: {refusal}")
                continue
            cancelled += changed
        self.message_user(request, f"{cancelled} reservation(s) cancelled.")
        if refused:
            self.message_user(request, "Not cancelled: " + "; ".join(refused), messages.WARNING)


@admin.register(Allocation)
class AllocationAdmin(ServiceWrittenAdmin):
    list_display = ("reservation", "gpu", "gpu_request", "gpu_memory_mib", "created_at", "released_at")


@admin.register(StateTransition)
class StateTransitionAdmin(ServiceWrittenAdmin):
    list_display = ("reservation", "from_state", "to_state", "actor_label", "reason", "at")
    list_filter = ("to_state",)
