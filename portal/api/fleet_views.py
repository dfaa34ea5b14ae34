"""API of the site admins' fleet actions: a node's agent token, a GPU's cordon, a node's planned
drains."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.audit import services as audit
from portal.fleet import drain_plans
from portal.fleet import services as fleet_services
from portal.fleet.models import OPEN_DRAINS, Gpu, Node, PlannedDrain
from portal.reservations import drain_effects

from . import admin_serializers as s
from . import permissions


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


ERRORS = {400: OpenApiResponse(description="Invalid input, per field"),
          404: OpenApiResponse(description="Not found")}


class NodeDrainsView(APIView):
    """A node's planned drains (maintenance windows): GET lists them (anyone who sees the fleet;
    `all=true` includes ended and cancelled ones), POST plans one (site admins): the node is drained
    at `starts_at` and ready again at `ends_at`. A plan that would break bookings answers 409
    naming them unless `force` (then their owners are told)."""

    @extend_schema(parameters=[OpenApiParameter("all", bool, description="include ended and cancelled plans")],
                   responses={200: s.PlannedDrainSerializer(many=True), **ERRORS})
    def get(self, request, name: str):
        node = get_object_or_404(Node, name=name)
        rows = PlannedDrain.objects.filter(node=node).select_related("node").order_by("starts_at", "pk")
        shown = request.query_params.get("all", "false")
        if shown not in ("true", "false"):
            raise ValidationError({"all": ["must be true or false"]})
        if shown == "false":
            rows = rows.filter(state__in=OPEN_DRAINS)
        return Response(s.PlannedDrainSerializer(rows, many=True).data)

    @extend_schema(request=s.PlannedDrainInputSerializer,
                   responses={201: s.PlannedDrainSerializer, **ERRORS,
                              409: OpenApiResponse(s.DrainConflictSerializer,
                                                   description="The window takes capacity bookings were promised")})
    def post(self, request, name: str):
        permissions.require_staff(request.user)
        node = get_object_or_404(Node, name=name)
        body = s.PlannedDrainInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        window = drain_plans.window_of(data["starts_at"], data["ends_at"], data["reason"])
        plan, _ = drain_effects.plan_drain(node, audit.api(request.user), window, force=data["force"])
        return Response(s.PlannedDrainSerializer(plan).data, status=status.HTTP_201_CREATED)


class NodeDrainView(APIView):
    """One planned drain: GET it; DELETE cancels one not started yet or ends one draining the node
    now (the node is returned if the plan drained it). Site admins only for DELETE."""

    def _plan(self, name: str, pk: int) -> PlannedDrain:
        return get_object_or_404(PlannedDrain.objects.select_related("node"), pk=pk, node__name=name)

    @extend_schema(responses={200: s.PlannedDrainSerializer, 404: ERRORS[404]})
    def get(self, request, name: str, pk: int):
        return Response(s.PlannedDrainSerializer(self._plan(name, pk)).data)

    @extend_schema(request=None, responses={200: s.PlannedDrainSerializer, 404: ERRORS[404]})
    def delete(self, request, name: str, pk: int):
        permissions.require_staff(request.user)
        plan = fleet_services.cancel_drain(self._plan(name, pk).pk, audit.api(request.user))
        return Response(s.PlannedDrainSerializer(plan).data)
