"""API of the audit log: who changed what, read by site admins (all) and team admins (their teams')."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, viewsets
from rest_framework.exceptions import ValidationError

from portal.audit import services as audit
from portal.audit.forms import AuditQuery
from portal.audit.models import AuditEntry
from portal.dates import DAY_PATTERN
from portal.tenancy import roles
from portal.tenancy.models import Role

from . import admin_serializers as s
from . import permissions
from .query import refuse_empty, refuse_unknown
from .schema import NO_NUL


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
