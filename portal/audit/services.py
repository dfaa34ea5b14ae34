"""Writing and reading the audit log. Every admin operation records its entry inside its own
transaction, so a change and its entry are written together or not at all."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from django.db.models import QuerySet
from django.utils import timezone

from .models import AuditEntry, Via


@dataclass(frozen=True)
class Actor:
    """Who acts and through what (the browser, the API, a command)."""

    user: object | None
    via: str = Via.SYSTEM

    @property
    def label(self) -> str:
        if self.user is None:
            return "system"
        if isinstance(self.user, str):
            return self.user
        return self.user.get_username()

    @property
    def user_obj(self):
        return None if self.user is None or isinstance(self.user, str) else self.user


def web(user) -> Actor:
    return Actor(user, Via.WEB)


def api(user) -> Actor:
    return Actor(user, Via.API)


def cli(label: str = "manage.py") -> Actor:
    return Actor(label, Via.CLI)


def record(by: Actor, *, object_type: str, object_repr: str, action: str, object_id: object = "",
           team=None, before: dict | None = None, after: dict | None = None, message: str = "") -> AuditEntry:
    return AuditEntry.objects.create(
        actor=by.user_obj, actor_label=by.label[:150], via=by.via, team=team,
        object_type=object_type, object_id=str(object_id)[:64], object_repr=str(object_repr)[:200],
        action=action, before=before or {}, after=after or {}, message=message[:500],
    )


def changed(before: dict, after: dict) -> tuple[dict, dict]:
    """Only the keys whose values differ, from both sides."""
    keys = [k for k in after if before.get(k) != after.get(k)]
    return {k: before.get(k) for k in keys}, {k: after[k] for k in keys}


def day_range(start: date | None, end: date | None) -> tuple[datetime | None, datetime | None]:
    """[start 00:00, end+1 00:00) in the current time zone."""
    tz = timezone.get_current_timezone()
    lo = datetime.combine(start, time.min, tzinfo=tz) if start else None
    hi = datetime.combine(end + timedelta(days=1), time.min, tzinfo=tz) if end else None
    return lo, hi


def entries(*, team=None, actor=None, object_type: str = "", object_id: str = "",
            since: datetime | None = None, before: datetime | None = None) -> QuerySet[AuditEntry]:
    qs = AuditEntry.objects.select_related("team")
    if team is not None:
        qs = qs.filter(team=team)
    if actor is not None:
        qs = qs.filter(actor=actor)
    if object_type:
        qs = qs.filter(object_type=object_type)
    if object_id:
        qs = qs.filter(object_id=object_id)
    if since is not None:
        qs = qs.filter(at__gte=since)
    if before is not None:
        qs = qs.filter(at__lt=before)
    return qs
