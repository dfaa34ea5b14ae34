"""REST API views: declarative querysets scoped to what the user may see; the domain work is done
by the services. Objects of other teams are filtered out of querysets, so they answer 404."""

from __future__ import annotations

from django.contrib.auth import authenticate
from django.db.models import Count, DecimalField, IntegerField, Q, Sum, Value
from django.db.models.functions import Coalesce
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import AuthenticationFailed, ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.audit import services as audit
from portal.fleet import services as fleet_services
from portal.fleet.models import Gpu, Node
from portal.reservations import services
from portal.reservations.models import Reservation
from portal.reservations.rules import ReservationSpec
from portal.tenancy import roles
from portal.tenancy import services as tenancy_services
from portal.tenancy.models import ApiToken

from . import capacity, permissions, serializers, team_settings_views
from .filters import FilterWhenAsked, ReservationFilter
from .query import StrictQueryParams, refuse_empty, refuse_unknown
from .throttling import SignInThrottle, WriteRateThrottle

ERRORS = {400: OpenApiResponse(description="Invalid input, per field"),
          404: OpenApiResponse(description="Not found (or not visible to you)")}


@extend_schema_view(
    create=extend_schema(responses={201: serializers.ReservationSerializer, 409: OpenApiResponse(
        serializers.BookingConflictSerializer,
        description="Beyond a hard limit of the team's quota (`never_fits`), or a booking whose window does not "
                    "fit (`booking_conflict`, with the nearest free windows)"), **ERRORS}),
)
class ReservationViewSet(mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                         viewsets.GenericViewSet):
    """GPU reservations of your teams. Members submit to their teams and cancel their own;
    team admins cancel any of their team's; managers read."""

    serializer_class = serializers.ReservationSerializer
    filterset_class = ReservationFilter
    filter_backends = [StrictQueryParams, FilterWhenAsked]  # settings' backends, the filter set built when asked

    def get_queryset(self):
        # The reservation rows alone: the serializer loads what they show from other tables (team,
        # owner and node names, live allocations) in one query per answer (reservation_related).
        reservations = Reservation.objects.visible_to(self.request.user)
        if self.action in ("cancel", "window"):
            return reservations.only("id", "team_id", "owner_id")  # what require_cancel reads
        return reservations

    def perform_create(self, serializer):
        data = dict(serializer.validated_data)
        team = data.pop("team")
        permissions.require_submit(self.request.user, team)
        window = booking_window(data)
        if window is not None:
            reservation = services.book(self.request.user, ReservationSpec(team=team, **data), window)[0]
            reservation.live_allocations = []
            serializer.instance = reservation
            return
        reservation = services.submit(self.request.user, ReservationSpec(team=team, **data))
        # Just submitted, it holds no GPUs: its answer's allocations need no query.
        reservation.live_allocations = []
        serializer.instance = reservation

    @extend_schema(request=None, responses={200: serializers.ReservationSerializer, 409: OpenApiResponse(
        description="The reservation has already finished"), 403: OpenApiResponse(description="Not yours")})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        reservation = self.get_object()
        permissions.require_cancel(request.user, reservation)
        cancelled, _changed = services.cancel(reservation.pk, request.user)  # the row as it was stored
        return Response(self.get_serializer(cancelled).data)

    @extend_schema(request=serializers.BookingWindowSerializer, responses={
        200: serializers.ReservationSerializer, 403: OpenApiResponse(description="Not yours"),
        409: OpenApiResponse(serializers.BookingConflictSerializer,
                             description="The new window does not fit (`booking_conflict`), or the reservation is "
                                         "no longer booked (`illegal_transition`)")})
    @action(detail=True, methods=["post"])
    def window(self, request, pk=None):
        """Move a booking's window; checked as a new booking would be, beside every other one."""
        reservation = self.get_object()
        permissions.require_cancel(request.user, reservation)  # the owner or a team admin, as for cancel
        body = serializers.BookingWindowSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        moved = services.move_booking(reservation.pk, request.user, body.validated_data["starts_at"],
                                      body.validated_data["ends_at"])
        return Response(self.get_serializer(moved).data)

    @extend_schema(responses={200: serializers.StateTransitionSerializer(many=True)})
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=None)
    def history(self, request, pk=None):
        reservation = self.get_object()
        return Response(serializers.StateTransitionSerializer(reservation.transitions.all(), many=True).data)


def booking_window(data: dict) -> services.Window | None:
    """Take a booking's window out of a create body (None: no `starts_at`, a request for now)."""
    starts_at, ends_at = data.pop("starts_at", None), data.pop("ends_at", None)
    duration_s, weeks = data.pop("duration_s", None), data.pop("repeat_weeks", None)
    if starts_at is None:
        given = [name for name, value in (("ends_at", ends_at), ("duration_s", duration_s),
                                          ("repeat_weeks", weeks)) if value is not None]
        if given:
            raise ValidationError({name: ["only with starts_at (a booking)"] for name in given})
        return None
    if data.get("max_duration_s") is not None:
        raise ValidationError({"max_duration_s": ["a booking lasts its window: give ends_at or duration_s instead"]})
    return services.window_of(starts_at, ends_at, duration_s, weeks or 1)


class BookingsView(APIView):
    """Booked capacity over a span (default: the next four weeks): the bookings you may see (members:
    their team's; managers: the teams they manage; site admins: all), per GPU model the fleet's
    cards and the most of them those bookings take at once, and (site admins and team managers, as
    the calendar page) the drains planned over the span."""

    @extend_schema(parameters=[serializers.BookingsQuerySerializer],
                   responses={200: serializers.BookingsAnswerSerializer, **ERRORS})
    def get(self, request):
        from portal.reservations import booking_calendar

        refuse_unknown(request.query_params, set(serializers.BookingsQuerySerializer().fields))
        refuse_empty(request.query_params, {"from", "to", "mine"})
        query = serializers.BookingsQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        q = query.validated_data
        rows = list(booking_calendar.bookings_of(request.user, q["from"], q["to"], q["gpu_model"],
                                                 q["mine"] == "true"))
        drains = (booking_calendar.drain_dips(q["from"], q["to"], q["gpu_model"])
                  if booking_calendar.sees_fleet(request.user) else [])
        answer = {"from": q["from"], "to": q["to"], "bookings": rows, "drains": drains,
                  "models": booking_calendar.load_by_model(rows, q["gpu_model"])}
        return Response(serializers.BookingsAnswerSerializer(answer).data)


class TeamViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                  mixins.UpdateModelMixin, viewsets.GenericViewSet):
    """Teams you belong to (all, for site admins). Site admins create teams and set quotas."""

    serializer_class = serializers.TeamSerializer
    lookup_field = "slug"
    lookup_value_regex = r"[-a-zA-Z0-9_]+"

    def get_queryset(self):
        return roles.visible_teams(self.request.user)

    def perform_create(self, serializer):
        permissions.require_staff(self.request.user)
        serializer.instance = team_settings_views.create_team(self.request, serializer)

    def perform_update(self, serializer):
        permissions.require_staff(self.request.user)
        serializer.instance = team_settings_views.update_team(self.request, serializer.instance, serializer)


class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    """The GPU nodes. Site admins drain a node (no new placements) and return it to service."""

    serializer_class = serializers.NodeSerializer
    lookup_field = "name"
    lookup_value_regex = r"[-a-zA-Z0-9_.]+"
    filterset_fields = ["status"]

    def get_queryset(self):
        return Node.objects.annotate(gpu_count=Count("gpus")).order_by("name")

    @extend_schema(request=serializers.NodeActionSerializer, responses={200: serializers.NodeSerializer})
    @action(detail=True, methods=["post"])
    def drain(self, request, name=None):
        return self._set(request, fleet_services.drain)

    @extend_schema(request=serializers.NodeActionSerializer, responses={200: serializers.NodeSerializer})
    @action(detail=True, methods=["post"])
    def undrain(self, request, name=None):
        return self._set(request, fleet_services.undrain)

    def _set(self, request, operation):
        permissions.require_staff(request.user)
        node = self.get_object()
        body = serializers.NodeActionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        operation(node.pk, audit.api(request.user), body.validated_data["reason"])
        return Response(self.get_serializer(self.get_queryset().get(pk=node.pk)).data)


class GpuViewSet(viewsets.ReadOnlyModelViewSet):
    """Every GPU with what your teams hold on it now (site admins: every team's). Another team's
    shares are not shown per GPU; the capacity preview says what could still be placed."""

    serializer_class = serializers.GpuSerializer
    lookup_field = "uuid"
    lookup_value_regex = r"[-a-zA-Z0-9_.]+"
    filterset_fields = ["model", "node__name"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no user
            return Gpu.objects.none()
        live = Q(allocations__released_at__isnull=True)
        if not self.request.user.is_staff:
            live &= Q(allocations__reservation__team__in=roles.visible_teams(self.request.user))
        return Gpu.objects.select_related("node").annotate(
            allocated_request=Coalesce(Sum("allocations__gpu_request", filter=live),
                                       Value(0), output_field=DecimalField(max_digits=6, decimal_places=3)),
            allocated_memory_mib=Coalesce(Sum("allocations__gpu_memory_mib", filter=live), Value(0),
                                          output_field=IntegerField()),
        ).order_by("node__name", "index")


TOKEN_CONFLICT = OpenApiResponse(description="You already have a live token of that name (and no `replace`)")


def _new_token(user, body: dict) -> Response:
    """Make the named token, or answer 409 naming the live one of that name (nothing reused)."""
    try:
        token, key, replaced = tenancy_services.replace_token(user, body["name"], replace=body["replace"])
    except tenancy_services.TokenNameTaken as exc:
        return Response({"name": [str(exc)]}, status=status.HTTP_409_CONFLICT)
    token.key, token.replaced = key, replaced
    return Response(serializers.NewTokenSerializer(token).data, status=status.HTTP_201_CREATED)


@extend_schema_view(create=extend_schema(request=serializers.NewTokenRequestSerializer,
                                         responses={201: serializers.NewTokenSerializer, 409: TOKEN_CONFLICT}))
class TokenViewSet(mixins.ListModelMixin, mixins.CreateModelMixin, mixins.DestroyModelMixin,
                   viewsets.GenericViewSet):
    """Your API tokens. The key is shown once, at creation; DELETE revokes."""

    serializer_class = serializers.TokenSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no user
            return ApiToken.objects.none()
        tokens = ApiToken.objects.filter(user=self.request.user)
        if self.action == "destroy":
            return tokens.filter(revoked_at__isnull=True)  # revoking twice: 404, not 204 again
        return tokens

    def create(self, request, *args, **kwargs):
        body = serializers.NewTokenRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return _new_token(request.user, body.validated_data)

    def perform_destroy(self, instance):
        tenancy_services.revoke_token(instance)


class ObtainTokenView(APIView):
    """Exchange a username, password and a token name for a new API token (for CLIs and scripts).
    A name already in use is refused (409) unless `replace` asks to revoke that token."""

    permission_classes = [AllowAny]
    authentication_classes = []
    # Failed sign-ins are throttled before the password is hashed; writes as everywhere.
    throttle_classes = [SignInThrottle, WriteRateThrottle]

    def get_authenticate_header(self, request) -> str:
        return "Token"  # wrong credentials answer 401 (not 403) with a challenge

    @extend_schema(request=serializers.TokenRequestSerializer,
                   responses={201: serializers.NewTokenSerializer, 400: OpenApiResponse(description="Invalid"),
                              401: OpenApiResponse(description="Wrong credentials"), 409: TOKEN_CONFLICT})
    def post(self, request):
        body = serializers.TokenRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        user = authenticate(request, username=body.validated_data["username"],
                            password=body.validated_data["password"])
        if user is None:
            raise AuthenticationFailed("wrong username or password")
        return _new_token(user, body.validated_data)


class CapacityView(APIView):
    """The GPUs that could take such a request now; when none could, the reasons why."""

    @extend_schema(parameters=[serializers.CapacityQuerySerializer],
                   responses={200: serializers.CapacityAnswerSerializer, **ERRORS})
    def get(self, request):
        refuse_unknown(request.query_params, set(serializers.CapacityQuerySerializer().fields))
        refuse_empty(request.query_params, {"gpu_request", "gpu_memory_mib", "gpu_count", "limit", "priority"})
        query = serializers.CapacityQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(capacity.answer(request.user, **query.validated_data))
