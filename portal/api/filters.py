import django_filters

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
