"""API of the admin operations. Each view finds the object among those the user may see (others
answer 404), checks the role (403), and calls the service, which validates, writes and audits."""

from __future__ import annotations

from django.db import transaction
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.audit import services as audit
from portal.audit.forms import AuditQuery
from portal.audit.models import AuditEntry
from portal.dates import DAY_PATTERN
from portal.fleet import services as fleet_services
from portal.fleet.models import Gpu, Node
from portal.reservations import presets, team_effects, team_usage
from portal.tenancy import departments, groups, members, policy, quotas, roles, teams
from portal.tenancy.models import AffinityLabel, Department, ExclusionGroup, Membership, Preset, Role

from . import admin_serializers as s
from . import permissions
from .filters import MembershipFilter
from .query import refuse_empty, refuse_unknown
from .schema import NO_NUL
from .serializers import ExclusionGroupSerializer


def _team(request, slug: str):
    return get_object_or_404(roles.visible_teams(request.user), slug=slug)


class TeamScopedMixin:
    """Objects of a team: visible to its people (404 to others); changed by its admins and staff."""

    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    model = None

    def get_queryset(self):
        qs = self.model.objects.select_related("team")
        if getattr(self, "swagger_fake_view", False):
            return qs.none()
        if not self.request.user.is_staff:
            qs = qs.filter(team__in=roles.visible_teams(self.request.user))
        return qs


class MembershipViewSet(TeamScopedMixin, viewsets.ModelViewSet):
    """Who is in your teams with which role. Team admins add people (by username or e-mail),
    change roles and default groups, and remove them; each answer states the effect."""

    model = Membership
    serializer_class = s.MemberSerializer
    filterset_class = MembershipFilter

    def get_queryset(self):
        return super().get_queryset().select_related("user", "default_exclusion", "default_affinity")

    def create(self, request, *args, **kwargs):
        body = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        team = body.validated_data["team"]
        permissions.require_team_admin(request.user, team)
        m = members.add_member(team, audit.api(request.user), body.validated_data["user"], body.validated_data["role"])
        return Response(self.get_serializer(self.get_queryset().get(pk=m.pk)).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.MemberUpdateSerializer, responses={200: s.MemberSerializer})
    def partial_update(self, request, *args, **kwargs):
        m = self.get_object()
        permissions.require_team_admin(request.user, m.team)
        body = s.MemberUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        if "role" in data:
            m = members.change_role(m, audit.api(request.user), data["role"])
        if "default_exclusion" in data or "default_affinity" in data:
            current = members.defaults_for(m.user, m.team)
            members.set_defaults(m, audit.api(request.user),
                                 exclusion=data.get("default_exclusion", current["exclusion"]) or None,
                                 affinity=data.get("default_affinity", current["affinity"]) or None)
        return Response(self.get_serializer(self.get_queryset().get(pk=m.pk)).data)

    def update(self, request, *args, **kwargs):
        return self.partial_update(request, *args, **kwargs)

    def destroy(self, request, *args, **kwargs):
        m = self.get_object()
        permissions.require_team_admin(request.user, m.team)
        members.remove_member(m, audit.api(request.user), team_effects.member_removal(m))
        return Response(status=status.HTTP_204_NO_CONTENT)


class _GroupViewSet(TeamScopedMixin, viewsets.ModelViewSet):
    kind = ""
    filterset_fields = ["team__slug", "label"]

    def create(self, request, *args, **kwargs):
        body = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        team = body.validated_data["team"]
        permissions.require_team_admin(request.user, team)
        obj = groups.create(team, audit.api(request.user), self.kind, body.validated_data["label"],
                            body.validated_data.get("description", ""))
        return Response(self.get_serializer(obj).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.GroupChangeSerializer)
    def partial_update(self, request, *args, **kwargs):
        obj = self.get_object()
        permissions.require_team_admin(request.user, obj.team)
        body = s.GroupChangeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        label = body.validated_data.get("label")
        effect = team_effects.group_rename(obj, label.strip()) if label is not None else ""
        obj = groups.update(obj, audit.api(request.user), **body.validated_data, rename_effect=effect)
        return Response(self.get_serializer(obj).data)

    def update(self, request, *args, **kwargs):
        return self.partial_update(request, *args, **kwargs)

    def destroy(self, request, *args, **kwargs):
        obj = self.get_object()
        permissions.require_team_admin(request.user, obj.team)
        groups.delete(obj, audit.api(request.user), team_effects.group_deletion(obj))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses={200: s.PreviewSerializer})
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=None)
    def preview(self, request, pk=None):
        """What this group means on the fleet now: where its requests can and cannot land."""
        obj = self.get_object()
        return Response(s.PreviewSerializer(team_effects.preview(obj.team, self.kind, obj.label)).data)


class ExclusionGroupViewSet(_GroupViewSet):
    """Exclusion groups (Gemini): workloads with different exclusion labels never share a GPU."""

    model = ExclusionGroup
    kind = "exclusion"
    serializer_class = ExclusionGroupSerializer


class AffinityLabelViewSet(_GroupViewSet):
    """Affinity labels: requests with affinity L go to GPUs holding L; with anti-affinity L, away from them."""

    model = AffinityLabel
    kind = "affinity"
    serializer_class = s.AffinityLabelSerializer


class PresetViewSet(TeamScopedMixin, viewsets.ModelViewSet):
    """Request presets of your teams (members see them first on the request page); team admins
    create, change and delete them."""

    model = Preset
    serializer_class = s.PresetSerializer
    filterset_fields = ["team__slug"]

    def create(self, request, *args, **kwargs):
        body = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        team = data.pop("team")
        permissions.require_team_admin(request.user, team)
        preset = presets.create_preset(team, audit.api(request.user), data)
        return Response(self.get_serializer(preset).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request, *args, **kwargs):
        preset = self.get_object()
        permissions.require_team_admin(request.user, preset.team)
        body = self.get_serializer(preset, data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        if "team" in data and data.pop("team") != preset.team:
            raise ValidationError({"team": ["a preset cannot move to another team; create it there"]})
        preset = presets.update_preset(preset, audit.api(request.user), data)
        return Response(self.get_serializer(preset).data)

    def update(self, request, *args, **kwargs):
        return self.partial_update(request, *args, **kwargs)

    def destroy(self, request, *args, **kwargs):
        preset = self.get_object()
        permissions.require_team_admin(request.user, preset.team)
        presets.delete_preset(preset, audit.api(request.user))
        return Response(status=status.HTTP_204_NO_CONTENT)


class TeamPolicyView(APIView):
    """A team's policy and its limits. Team admins PATCH the policy (within the limits)."""

    @extend_schema(responses={200: s.PolicyAnswerSerializer})
    def get(self, request, slug: str):
        return Response(policy.policy_of(_team(request, slug)).as_dict())

    @extend_schema(request=s.PolicySerializer, responses={200: s.PolicyAnswerSerializer})
    def patch(self, request, slug: str):
        team = _team(request, slug)
        permissions.require_team_admin(request.user, team)
        body = s.PolicySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(policy.set_policy(team, audit.api(request.user), dict(body.validated_data)).as_dict())


class TeamLimitsView(APIView):
    """Site admins set the limits a team's admins choose their policy within."""

    @extend_schema(request=s.LimitsSerializer, responses={200: s.PolicyAnswerSerializer})
    def patch(self, request, slug: str):
        team = _team(request, slug)
        permissions.require_staff(request.user)
        body = s.LimitsSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(policy.set_limits(team, audit.api(request.user), dict(body.validated_data)).as_dict())


class TeamUsageView(APIView):
    """Quota, guaranteed use, opportunistic use beyond it, per member; waiting requests with reasons."""

    @extend_schema(responses={200: OpenApiResponse(description="the team's use of its quota")})
    def get(self, request, slug: str):
        return Response(team_usage.team_usage(_team(request, slug)).as_dict())


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
        return _team(request, slug)


@extend_schema_view(
    get=extend_schema(description=QUOTAS_DOC.format("A department"),
                      responses={200: s.QuotaRowSerializer(many=True)}),
    put=extend_schema(description=QUOTAS_DOC.format("A department"), request=s.QuotaRowInputSerializer(many=True),
                      responses={200: s.QuotaRowSerializer(many=True)}),
)
class DepartmentQuotasView(_QuotasView):
    def unit(self, request, slug: str):
        return get_object_or_404(departments.visible_departments(request.user), slug=slug)


class NodeTokenView(APIView):
    """A node's agent token: POST creates or rotates it (the key is in this answer only; the old
    key is refused from now on), DELETE revokes it. Site admins only."""

    def _node(self, request, name: str) -> Node:
        permissions.require_staff(request.user)
        return get_object_or_404(Node, name=name)

    @extend_schema(request=None, responses={201: s.NodeTokenSerializer})
    def post(self, request, name: str):
        node = self._node(request, name)
        key = fleet_services.issue_node_token(node, audit.api(request.user))
        return Response({"node": node.name, "key": key, "created_at": node.agent_token_created_at},
                        status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={204: None})
    def delete(self, request, name: str):
        fleet_services.revoke_node_token(self._node(request, name), audit.api(request.user))
        return Response(status=status.HTTP_204_NO_CONTENT)


class GpuCordonView(APIView):
    """POST cordons a GPU (no new shares; running ones stay), DELETE uncordons. Site admins only."""

    def _gpu(self, request, uuid: str) -> Gpu:
        permissions.require_staff(request.user)
        return get_object_or_404(Gpu, uuid=uuid)

    @extend_schema(request=s.GpuActionSerializer, responses={200: OpenApiResponse(description="the GPU")})
    def post(self, request, uuid: str):
        gpu = self._gpu(request, uuid)
        body = s.GpuActionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        gpu = fleet_services.set_cordon(gpu.pk, audit.api(request.user), True, body.validated_data["reason"])
        return Response({"uuid": gpu.uuid, "cordoned": gpu.cordoned, "cordon_reason": gpu.cordon_reason})

    @extend_schema(request=None, responses={200: OpenApiResponse(description="the GPU")})
    def delete(self, request, uuid: str):
        gpu = fleet_services.set_cordon(self._gpu(request, uuid).pk, audit.api(request.user), False)
        return Response({"uuid": gpu.uuid, "cordoned": gpu.cordoned, "cordon_reason": gpu.cordon_reason})


def audit_scope(user):
    """The audit entries `user` may read: all for site admins, their teams' for team admins."""
    if user.is_staff:
        return AuditEntry.objects.all()
    admin_of = [t for t, r in roles.team_roles(user).items() if r == Role.ADMIN]
    return AuditEntry.objects.filter(team_id__in=admin_of)


class AuditViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Who changed what, when, through the browser or the API, before → after. Site admins read
    all; team admins their teams' entries."""

    serializer_class = s.AuditEntrySerializer
    filter_backends = []

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return AuditEntry.objects.none()
        user = self.request.user
        if not user.is_staff and Role.ADMIN not in roles.team_roles(user).values():
            permissions.require_staff(user)
        params = self.request.query_params
        refuse_unknown(params, {"team", "user", "object_type", "object_id", "since", "until", "page", "page_size"})
        refuse_empty(params, {"since", "until"})  # `?until=` is a mistake, as for every typed parameter
        query = AuditQuery(params)
        if not query.is_valid():
            raise ValidationError(query.problems())
        q = query.cleaned_data
        lo, hi = audit.day_range(q["since"], q["until"])
        qs = audit.entries(object_type=q["object_type"], object_id=q["object_id"],
                           since=lo, before=hi).filter(pk__in=audit_scope(user).values("pk"))
        if q["team"]:
            qs = qs.filter(team__slug=q["team"])
        if q["user"]:
            qs = qs.filter(actor__username=q["user"])
        return qs

    @extend_schema(parameters=[
        *(OpenApiParameter(name, {"type": "string", "maxLength": AuditQuery.base_fields[name].max_length,
                                  "pattern": NO_NUL}) for name in ("team", "user", "object_type", "object_id")),
        *(OpenApiParameter(name, {"type": "string", "format": "date", "pattern": DAY_PATTERN},
                           description="YYYY-MM-DD, from 1970-01-01 to 9998-12-31")
          for name in ("since", "until"))])
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)


def create_team(request, body) -> object:
    """TeamViewSet.perform_create: site admins create teams (audited), with their `*` quota row from
    the deprecated quota fields."""
    data = dict(body.validated_data)
    return teams.create_team(audit.api(request.user), data.pop("slug"), data.pop("name"),
                             department=data.get("department"),
                             **{k: v for k, v in data.items() if k in teams.QUOTA_FIELDS})


def update_team(request, team, body) -> object:
    """TeamViewSet.perform_update: every change of one PATCH, or none of them."""
    data = body.validated_data
    by = audit.api(request.user)
    with transaction.atomic():
        if "allow_over_quota" in data:
            policy.set_policy(team, by, {"allow_over_quota": data["allow_over_quota"]})
        if "department" in data:
            departments.move_team(team, by, data["department"].slug if data["department"] else None)
        return teams.set_quota(team, by, {k: v for k, v in data.items() if k in (*teams.QUOTA_FIELDS, "name")})
