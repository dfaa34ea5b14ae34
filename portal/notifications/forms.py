"""The preferences page's form: a box per event and channel, the waiting limit in minutes and the
webhook URL, each refused in the person's words."""

from __future__ import annotations

from django import forms

from . import preferences, webhooks
from .models import Channel, Event, Preferences


def box_name(event: str, channel: str) -> str:
    return f"{event}__{channel}"


class PreferencesForm(forms.Form):
    waiting_after_min = forms.IntegerField(
        label="Tell me when a reservation has waited longer than (minutes)",
        min_value=preferences.WAITING_AFTER_RANGE[0], max_value=preferences.WAITING_AFTER_RANGE[1],
        error_messages={"required": "Say after how many minutes of waiting you want to hear (1 to 1440).",
                        "invalid": "Give the minutes as a whole number, e.g. 15.",
                        "min_value": "Wait at least 1 minute before you are told.",
                        "max_value": "At most 1440 minutes (a day)."})
    webhook_url = forms.CharField(
        label="Webhook URL (Slack-compatible)", required=False, max_length=500,
        help_text='We POST {"text": "…"} to it for the events you tick in the Webhook column.',
        error_messages={"max_length": "A webhook URL of at most 500 characters."})

    def __init__(self, *args, prefs: Preferences, **kwargs) -> None:
        initial = {"waiting_after_min": prefs.waiting_after_min, "webhook_url": prefs.webhook_url}
        for event in Event.values:
            chosen = preferences.channels_for(prefs, event)
            for channel in Channel.values:
                initial[box_name(event, channel)] = channel in chosen
        super().__init__(*args, initial=initial, **kwargs)
        for event, event_label in Event.choices:
            for channel, channel_label in Channel.choices:
                self.fields[box_name(event, channel)] = forms.BooleanField(
                    required=False, label=f"{event_label}: {channel_label}")

    def clean_webhook_url(self) -> str:
        url = self.cleaned_data["webhook_url"].strip()
        if url:
            try:
                webhooks.check(url)
            except webhooks.WebhookRefused as exc:
                raise forms.ValidationError(str(exc)) from None
        return url

    def clean(self):
        data = super().clean()
        wants_webhook = any(data.get(box_name(e, Channel.WEBHOOK)) for e in Event.values)
        if wants_webhook and not data.get("webhook_url") and "webhook_url" not in self.errors:
            self.add_error("webhook_url", "Give a webhook URL, or untick the Webhook column.")
        return data

    def rows(self) -> list[dict]:
        """One row per event with its boxes, for the table."""
        return [{"label": label, "boxes": [self[box_name(event, c)] for c in Channel.values]}
                for event, label in Event.choices]

    def channels(self) -> dict[str, set[str]]:
        return {e: {c for c in Channel.values if self.cleaned_data.get(box_name(e, c))} for e in Event.values}
