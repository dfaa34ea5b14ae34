"""`GET /api/v1/workloads/`: the workloads page's list as JSON, with the same filters and sort
(portal.web.workloads): the reservations of the teams a manager, team admin or site admin looks
after, paged like every list of the API. Members are refused (403), as on the page."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, serializers
from rest_framework.exceptions import PermissionDenied, ValidationError

from portal.api.query import PAGINATION, refuse_empty, refuse_unknown
from portal.reservations.states import State
from portal.web import workloads as query

FILTERS = query.PARAMS - {"page"}


class WorkloadSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    team = serializers.CharField()
    user = serializers.CharField()
    name = serializers.CharField()
    state = serializers.ChoiceField(choices=State.choices)
    gpu_model = serializers.CharField(help_text="the models of the GPUs it holds or held, else the one requested")
    share_pct = serializers.FloatField(help_text="its share of each GPU, in percent")
    memory_gib = serializers.FloatField(help_text="GPU memory per GPU, GiB")
    node = serializers.CharField(help_text="empty until placed")
    gpus = serializers.ListField(child=serializers.CharField(), help_text="node/index of each GPU, e.g. a100-node-1/0")
    created = serializers.DateTimeField()
    started = serializers.DateTimeField(allow_null=True)
    ended = serializers.DateTimeField(allow_null=True)


@extend_schema(
    parameters=[
        OpenApiParameter("team", str, description="one of your teams (default: all of them)"),
        OpenApiParameter("user", str, description="the owner's username"),
        OpenApiParameter("state", str, enum=["active", *State.values],
                         description="active: pending, placed or running"),
        OpenApiParameter("gpu_model", str, description="held a GPU of this model, or asked for it"),
        OpenApiParameter("since", OpenApiTypes.DATE, description="existed on or after this day (portal time zone)"),
        OpenApiParameter("until", OpenApiTypes.DATE, description="existed on or before this day (included)"),
        OpenApiParameter("sort", str, enum=sorted(k for k, _ in query.WorkloadQuery.base_fields["sort"].choices),
                         description="a column; a leading '-' sorts descending (default -created)"),
    ],
    responses={200: WorkloadSerializer(many=True),
               400: OpenApiResponse(description="Invalid filter, per parameter"),
               403: OpenApiResponse(description="For team managers, team admins and site admins"),
               404: OpenApiResponse(description="No team of that name that you look after")},
)
class WorkloadListView(generics.ListAPIView):
    """Your teams' reservations, filtered and sorted as on the workloads page."""

    serializer_class = WorkloadSerializer
    filter_backends: list = []

    def get_queryset(self):
        params = self.request.query_params
        refuse_unknown(params, FILTERS | PAGINATION)
        refuse_empty(params, {"state", "sort", "since", "until"})
        form = query.WorkloadQuery({k: v for k, v in params.items() if k in FILTERS})
        if not form.is_valid():
            raise ValidationError({k: [str(e) for e in v] for k, v in form.errors.items()})
        try:
            return query.workloads(self.request.user, form.cleaned_data)
        except query.PermissionDenied as exc:
            raise PermissionDenied(str(exc)) from None

    def list(self, request, *args, **kwargs):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(WorkloadSerializer([query.row(r) for r in page], many=True).data)
