"""API of a team's own settings: its policy (team admins, within its limits), its limits (site
admins), its use of its quota; and the team rows TeamViewSet writes through the tenancy services."""

from __future__ import annotations

from django.db import transaction
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.audit import services as audit
from portal.reservations import team_usage
from portal.tenancy import departments, policy, teams

from . import admin_serializers as s
from . import permissions
from .team_admin_views import team_of


class TeamPolicyView(APIView):
    """A team's policy and its limits. Team admins PATCH the policy (within the limits)."""

    @extend_schema(responses={200: s.PolicyAnswerSerializer})
    def get(self, request, slug: str):
        return Response(policy.policy_of(team_of(request, slug)).as_dict())

    @extend_schema(request=s.PolicySerializer, responses={200: s.PolicyAnswerSerializer})
    def patch(self, request, slug: str):
        team = team_of(request, slug)
        permissions.require_team_admin(request.user, team)
        body = s.PolicySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(policy.set_policy(team, audit.api(request.user), dict(body.validated_data)).as_dict())


class TeamLimitsView(APIView):
    """Site admins set the limits a team's admins choose their policy within."""

    @extend_schema(request=s.LimitsSerializer, responses={200: s.PolicyAnswerSerializer})
    def patch(self, request, slug: str):
        team = team_of(request, slug)
        permissions.require_staff(request.user)
        body = s.LimitsSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(policy.set_limits(team, audit.api(request.user), dict(body.validated_data)).as_dict())


class TeamUsageView(APIView):
    """Quota, guaranteed use, opportunistic use beyond it, per member; waiting requests with reasons."""

    @extend_schema(responses={200: OpenApiResponse(description="the team's use of its quota")})
    def get(self, request, slug: str):
        return Response(team_usage.team_usage(team_of(request, slug)).as_dict())


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
