"""E-mail through Django's mail backends (SMTP from the settings; the demo's file backend writes into
var/mail/, which `demo_mails` reads back for the demo's mail page)."""

from __future__ import annotations

from email import message_from_string, policy
from email.utils import getaddresses, parsedate_to_datetime
from pathlib import Path

from django.conf import settings
from django.core.mail import send_mail

from .models import Notification

SEPARATOR = "-" * 79  # what Django's file backend writes after each message


def send(n: Notification) -> None:
    link = f"{settings.TESSERA_PUBLIC_URL.rstrip('/')}/reservations/{n.reservation_id}/" if n.reservation_id else ""
    body = n.text + (f"\n\nOpen it: {link}" if link else "") + (
        f"\n\nChoose what you are told, and how: {settings.TESSERA_PUBLIC_URL.rstrip('/')}/notifications/settings/")
    send_mail(f"[Tessera] {n.subject}", body, settings.DEFAULT_FROM_EMAIL, [n.user.email], fail_silently=False)


def demo_mails(address: str, limit: int = 50) -> list[dict]:
    """The mails the file backend wrote to `address`, newest first (demo mode only)."""
    folder = Path(settings.EMAIL_FILE_PATH)
    if not address or not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob("*.log"), key=lambda p: p.stat().st_mtime, reverse=True)[:200]:
        for chunk in path.read_text(errors="replace").split("\n" + SEPARATOR + "\n"):
            if not chunk.strip():
                continue
            message = message_from_string(chunk.strip() + "\n", policy=policy.default)
            if address.lower() not in {a.lower() for _, a in getaddresses([str(message.get("To", ""))])}:
                continue
            body = message.get_body(("plain",))
            try:
                when = parsedate_to_datetime(str(message.get("Date"))).timestamp()
            except (TypeError, ValueError):
                when = 0.0
            found.append({"when": when, "subject": str(message.get("Subject", "")),
                          "date": str(message.get("Date", "")), "to": str(message.get("To", "")),
                          "body": body.get_content() if body else ""})
    found.sort(key=lambda m: m["when"], reverse=True)
    return found[:limit]
