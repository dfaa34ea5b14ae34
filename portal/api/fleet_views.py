"""API of the site admins' fleet actions: a node's agent token, a GPU's cordon."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.audit import services as audit
from portal.fleet import services as fleet_services
from portal.fleet.models import Gpu, Node

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
