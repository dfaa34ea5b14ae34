"""API of the organisation's tree: departments (site admins create, rename, move and delete them)
and the quotas per GPU model of departments and teams."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.audit import services as audit
from portal.tenancy import departments, quotas
from portal.tenancy.models import Department

from . import admin_serializers as s
from . import permissions
from .query import refuse_unknown
from .team_admin_views import team_of


class DepartmentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Departments: nodes of the organisation's tree above teams, nested at most 4 levels. Everyone
    sees the departments their teams are under (others answer 404); site admins see all, and create,
    rename, move (`parent`) and delete them."""

    serializer_class = s.DepartmentSerializer
    lookup_field = "slug"
    lookup_value_regex = r"[-a-zA-Z0-9_]+"
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Department.objects.none()
        return departments.visible_departments(self.request.user).select_related("parent")

    def create(self, request, *args, **kwargs):
        permissions.require_staff(request.user)
        body = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        made = departments.create_department(audit.api(request.user), data["slug"], data["name"], data.get("parent"))
        return Response(self.get_serializer(made).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.DepartmentChangeSerializer, responses={200: s.DepartmentSerializer})
    def partial_update(self, request, *args, **kwargs):
        department = self.get_object()
        permissions.require_staff(request.user)
        body = s.DepartmentChangeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        department = departments.update_department(department, audit.api(request.user), dict(body.validated_data))
        return Response(self.get_serializer(department).data)

    def destroy(self, request, *args, **kwargs):
        department = self.get_object()
        permissions.require_staff(request.user)
        departments.delete_department(department, audit.api(request.user))
        return Response(status=status.HTTP_204_NO_CONTENT)


def _quota_rows(request) -> list[dict]:
    """The PUT body as rows for the service; type errors as one object naming row and field
    (`quotas[1].gpu_share`), like the service's own refusals."""
    body = s.QuotaRowInputSerializer(data=request.data, many=True, max_length=quotas.MAX_ROWS)
    if body.is_valid():
        return [dict(row) for row in body.validated_data]
    errors = body.errors
    if isinstance(errors, dict):  # the body as a whole: not a list, or too long
        raise ValidationError({"quotas": [str(m) for ms in errors.values() for m in ms]})
    flat: dict[str, list[str]] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for name, inner in value.items():
                walk(f"{prefix}.{name}", inner)
        else:
            flat[prefix] = [str(m) for m in value]

    for i, row in enumerate(errors):
        walk(f"quotas[{i}]", row)
    raise ValidationError(flat)


class _QuotasView(APIView):
    def unit(self, request, slug: str):
        raise NotImplementedError

    def get(self, request, slug: str):
        refuse_unknown(request.query_params, set())
        return Response(s.QuotaRowSerializer(quotas.quotas_of(self.unit(request, slug)), many=True).data)

    def put(self, request, slug: str):
        refuse_unknown(request.query_params, set())
        unit = self.unit(request, slug)
        permissions.require_staff(request.user)
        rows = quotas.replace_quotas(unit, audit.api(request.user), _quota_rows(request))
        return Response(s.QuotaRowSerializer(rows, many=True).data)


QUOTAS_DOC = ("{}'s quotas per GPU model (`*`: any model without a row of its own). PUT replaces the whole "
              "list (site admins): rows not given are deleted; refused, with the numbers, where children's "
              "quotas would exceed their parent's.")


@extend_schema_view(
    get=extend_schema(description=QUOTAS_DOC.format("A team"), responses={200: s.QuotaRowSerializer(many=True)}),
    put=extend_schema(description=QUOTAS_DOC.format("A team"), request=s.QuotaRowInputSerializer(many=True),
                      responses={200: s.QuotaRowSerializer(many=True)}),
)
class TeamQuotasView(_QuotasView):
    def unit(self, request, slug: str):
        return team_of(request, slug)


@extend_schema_view(
    get=extend_schema(description=QUOTAS_DOC.format("A department"),
                      responses={200: s.QuotaRowSerializer(many=True)}),
    put=extend_schema(description=QUOTAS_DOC.format("A department"), request=s.QuotaRowInputSerializer(many=True),
                      responses={200: s.QuotaRowSerializer(many=True)}),
)
class DepartmentQuotasView(_QuotasView):
    def unit(self, request, slug: str):
        return get_object_or_404(departments.visible_departments(request.user), slug=slug)
