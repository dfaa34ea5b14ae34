"""The one writer of notification rows. `notify` stores each event of a reservation once (its key
is unique: an insert that finds it there adds nothing, so a repeated signal or a second worker
tells nobody twice); after the commit the owners' pages hear their unread count and the e-mails
and webhooks go out from a Celery task, never from the request or the service that noticed."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.utils import timezone

from portal.reservations.models import Reservation

from . import live, preferences, texts
from .models import Channel, Delivery, Notification

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Occurrence:
    """One event of one reservation, with what its text names."""

    key: str
    event: str
    reservation: Reservation
    model: str = ""
    node: str = ""
    why: str = ""
    minutes: int = 0


def notify(occurrences: list[Occurrence]) -> list[int]:
    """Store the notifications not stored before; returns the ids this call created."""
    if not occurrences:
        return []
    owners = {o.reservation.owner_id for o in occurrences}
    prefs = preferences.of(owners)
    emails = dict(get_user_model().objects.filter(pk__in=owners).values_list("pk", "email"))
    now = timezone.now()
    rows = []
    for o in occurrences:
        uid = o.reservation.owner_id
        chosen = preferences.channels_for(prefs[uid], o.event)
        subject, text = texts.compose(o.event, o.reservation, o.model, o.node, o.why, o.minutes)
        email = Delivery.PENDING if Channel.EMAIL in chosen and emails.get(uid) else Delivery.OFF
        webhook = Delivery.PENDING if Channel.WEBHOOK in chosen and prefs[uid].webhook_url else Delivery.OFF
        rows.append((uid, o.reservation.pk, o.event, o.key[:80], subject[:200], text[:1000],
                     Channel.IN_APP in chosen, str(email), str(webhook), "", now))
    table = connection.ops.quote_name(Notification._meta.db_table)
    values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(rows))
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (user_id, reservation_id, event, key, subject, text, in_app, email, webhook, "  # noqa: S608 (our table name)
            f"webhook_error, created_at) VALUES {values} ON CONFLICT (key) DO NOTHING "
            "RETURNING id, user_id, in_app, email, webhook",
            [v for row in rows for v in row])
        created = cursor.fetchall()
        transaction.on_commit(lambda: _after_commit(created), robust=True)
    return [row[0] for row in created]


def _after_commit(created: list[tuple]) -> None:
    from . import tasks

    live.publish_unread({uid for _, uid, in_app, _, _ in created if in_app})
    for pk, _, _, email, webhook in created:
        if email == Delivery.PENDING:
            tasks.send_email.delay(pk)
        if webhook == Delivery.PENDING:
            tasks.post_webhook.delay(pk)


def mark_read(user, notification_id: int) -> bool:
    """Mark one of `user`'s notifications read; False when it was read already."""
    changed = bool(Notification.objects.filter(pk=notification_id, user=user, read_at__isnull=True)
                   .update(read_at=timezone.now()))
    if changed:
        transaction.on_commit(lambda: live.publish_unread([user.pk]), robust=True)
    return changed


def mark_all_read(user) -> int:
    changed = Notification.objects.filter(user=user, read_at__isnull=True).update(read_at=timezone.now())
    if changed:
        transaction.on_commit(lambda: live.publish_unread([user.pk]), robust=True)
    return changed


def claim(notification_id: int, channel: str) -> Notification | None:
    """Compare-and-set: the delivery of `channel` (email or webhook) is this caller's to send, if it
    is still waiting to be sent (a retried task or a second worker finds it taken)."""
    if Notification.objects.filter(pk=notification_id, **{channel: Delivery.PENDING}).update(
            **{channel: Delivery.SENDING}):
        return Notification.objects.select_related("user").get(pk=notification_id)
    return None


def delivered(notification_id: int, channel: str, ok: bool, error: str = "", retry: bool = False) -> None:
    """Record how a delivery went: sent, failed, or back to waiting for a retry."""
    status = Delivery.SENT if ok else Delivery.PENDING if retry else Delivery.FAILED
    fields = {channel: status}
    if channel == Channel.WEBHOOK:
        fields["webhook_error"] = error[:300]
    Notification.objects.filter(pk=notification_id, **{channel: Delivery.SENDING}).update(**fields)
