from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api.query import refuse_empty, refuse_unknown

from .forms import ReportQuery
from .services import GROUPS, utilization


class UtilizationRowSerializer(serializers.Serializer):
    key = serializers.CharField(help_text="Team slug, node name or GPU UUID")
    allocated_gpu_hours = serializers.FloatField()
    used_gpu_hours = serializers.FloatField()
    used_pct = serializers.FloatField(allow_null=True)
    device_busy_gpu_hours = serializers.FloatField(allow_null=True, help_text="Site admins only")


class UtilizationReportSerializer(serializers.Serializer):
    group_by = serializers.ChoiceField(choices=GROUPS)
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    rows = UtilizationRowSerializer(many=True)


class UtilizationReportView(APIView):
    """GPU time allocated versus really used, per team, node or GPU, over a window (default: the
    last 7 days), for the teams you may see."""

    @extend_schema(
        parameters=[
            OpenApiParameter("group_by", str, enum=list(GROUPS), description="default: team"),
            OpenApiParameter("since", OpenApiTypes.DATETIME, description="default: 7 days before until"),
            OpenApiParameter("until", OpenApiTypes.DATETIME, description="default: now"),
        ],
        responses={200: UtilizationReportSerializer},
    )
    def get(self, request):
        refuse_unknown(request.query_params, {"group_by", "since", "until"})
        refuse_empty(request.query_params, {"group_by", "since", "until"})
        query = ReportQuery(request.query_params)
        if not query.is_valid():
            raise serializers.ValidationError(query.errors)
        q = query.cleaned_data
        rows = utilization(request.user, q["group_by"], q["since"], q["until"])
        return Response({"group_by": q["group_by"], "since": q["since"], "until": q["until"],
                         "rows": [r.as_dict() for r in rows]})
