"""Celery tasks: the periodic checks (beat, every minute) and each notification's e-mail and webhook,
sent here and never in the request or service that noticed the event."""

from __future__ import annotations

import logging

from celery import shared_task

from . import mail, services, webhooks
from .checks import run_checks
from .models import Channel, Preferences

log = logging.getLogger(__name__)

WEBHOOK_TRIES = 3
WEBHOOK_BACKOFF_S = 10  # before the second try; doubled before the third


@shared_task(name="notifications.check", ignore_result=True)
def check() -> tuple[int, int]:
    """Waiting longer than each owner's limit, ending within 15 minutes."""
    return run_checks()


@shared_task(name="notifications.send_email", ignore_result=True)
def send_email(notification_id: int) -> None:
    n = services.claim(notification_id, Channel.EMAIL)
    if n is None:
        return  # sent already, or never asked for
    try:
        mail.send(n)
    except Exception:
        log.exception("could not e-mail notification %s to user %s", n.pk, n.user_id)
        services.delivered(n.pk, Channel.EMAIL, False)
        return
    services.delivered(n.pk, Channel.EMAIL, True)


@shared_task(bind=True, name="notifications.post_webhook", ignore_result=True, max_retries=WEBHOOK_TRIES - 1)
def post_webhook(self, notification_id: int) -> None:
    n = services.claim(notification_id, Channel.WEBHOOK)
    if n is None:
        return
    url = Preferences.objects.filter(user_id=n.user_id).values_list("webhook_url", flat=True).first() or ""
    try:
        if not url:
            raise webhooks.WebhookRefused("no webhook URL any more")
        webhooks.post(url, n.text)
    except webhooks.WebhookRefused as exc:
        services.delivered(n.pk, Channel.WEBHOOK, False, str(exc))
    except webhooks.WebhookFailed as exc:
        again = exc.retry and self.request.retries < self.max_retries
        services.delivered(n.pk, Channel.WEBHOOK, False, str(exc), retry=again)
        if again:
            raise self.retry(countdown=WEBHOOK_BACKOFF_S * 2 ** self.request.retries) from None
        log.warning("webhook of notification %s gave up: %s", n.pk, exc)
    else:
        services.delivered(n.pk, Channel.WEBHOOK, True)
