"""What a person was told (`Notification`, one row per event of a reservation) and how they want to
be told (`Preferences`, one row per person; absent = the defaults in preferences.py)."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Event(models.TextChoices):
    RUNNING = "running", "Running"
    WAITING = "waiting", "Waiting long"
    EXPIRING = "expiring", "Ends in 15 minutes"
    IDLE = "idle", "Idle warning"
    RECLAIM = "reclaim", "Reclaim warning"
    NODE_LOST = "node_lost", "Node lost"
    DRAIN = "drain", "Maintenance over a booking"
    FINISHED = "finished", "Finished"
    FAILED = "failed", "Failed"


class Channel(models.TextChoices):
    IN_APP = "in_app", "In the portal"
    EMAIL = "email", "E-mail"
    WEBHOOK = "webhook", "Webhook"


class Delivery(models.TextChoices):
    OFF = "off", "Not asked for"
    PENDING = "pending", "Waiting to be sent"
    SENDING = "sending", "Being sent"
    SENT = "sent", "Sent"
    FAILED = "failed", "Could not be sent"


class Preferences(models.Model):
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="notification_preferences")
    # {event: [channel, ...]} for the events the person changed; the others keep the defaults.
    channels = models.JSONField(default=dict, blank=True)
    waiting_after_min = models.PositiveSmallIntegerField(default=15)
    webhook_url = models.URLField(max_length=500, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"notification preferences of {self.user_id}"


class Notification(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications")
    reservation = models.ForeignKey("reservations.Reservation", null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    event = models.CharField(max_length=16, choices=Event.choices)
    # One per event of a reservation ("r42:running:1"): a second try to notify it inserts nothing.
    key = models.CharField(max_length=80, unique=True)
    subject = models.CharField(max_length=200)
    text = models.CharField(max_length=1000)
    in_app = models.BooleanField(default=True)
    email = models.CharField(max_length=8, choices=Delivery.choices, default=Delivery.OFF)
    webhook = models.CharField(max_length=8, choices=Delivery.choices, default=Delivery.OFF)
    webhook_error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    read_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["user", "-created_at"], name="notification_by_user"),
                   models.Index(fields=["user"], name="notification_unread",
                                condition=models.Q(read_at__isnull=True, in_app=True))]

    def __str__(self) -> str:
        return f"{self.key} → {self.user_id}"
