import django_filters
from django_filters.rest_framework import DjangoFilterBackend

from portal.reservations.models import Reservation
from portal.reservations.states import State
from portal.tenancy.models import Membership, Role


class ReservationFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=State.choices)
    team = django_filters.CharFilter(field_name="team__slug")
    owner = django_filters.CharFilter(field_name="owner__username")
    kind = django_filters.CharFilter()

    class Meta:
        model = Reservation
        fields = ["state", "team", "owner", "kind"]


class MembershipFilter(django_filters.FilterSet):
    team = django_filters.CharFilter(field_name="team__slug")
    user = django_filters.CharFilter(field_name="user__username")
    role = django_filters.ChoiceFilter(choices=Role.choices)

    class Meta:
        model = Membership
        fields = ["team", "user", "role"]


class FilterWhenAsked(DjangoFilterBackend):
    """DjangoFilterBackend that builds the filter set only when a query parameter could be one of
    its filters: a FilterSet deep-copies its filters and makes a form class each time (~1 ms of a
    list request here), and one given no values filters nothing. Conservative on purpose: any
    parameter whose name starts with a filter's name (`x`, `x_after`, …) takes DRF's path."""

    def filter_queryset(self, request, queryset, view):
        filterset_class = self.get_filterset_class(view, queryset)
        if filterset_class is not None and not any(
                key.startswith(name) for key in request.query_params for name in filterset_class.base_filters):
            return queryset
        return super().filter_queryset(request, queryset, view)
