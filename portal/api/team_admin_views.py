"""API of what team admins manage inside their teams: memberships, exclusion groups and affinity
labels, request presets. Each view finds the object among those the user may see (others answer
404), checks the role (403), and calls the service, which validates, writes and audits."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from portal.audit import services as audit
from portal.reservations import presets, team_effects
from portal.tenancy import groups, members, roles
from portal.tenancy.models import AffinityLabel, ExclusionGroup, Membership, Preset

from . import admin_serializers as s
from . import permissions
from .filters import MembershipFilter
from .serializers import ExclusionGroupSerializer


def team_of(request, slug: str):
    """The team among those the user may see (404 for others)."""
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
