from datetime import UTC, timedelta

from django import forms
from django.utils import timezone

from .services import GROUPS

MAX_SPAN = timedelta(days=400)


class ReportQuery(forms.Form):
    """The report window and grouping, for the API and the page alike."""

    group_by = forms.ChoiceField(choices=[(g, g) for g in GROUPS], required=False)
    since = forms.DateTimeField(required=False, help_text="ISO 8601; default: 7 days ago")
    until = forms.DateTimeField(required=False, help_text="ISO 8601; default: now")

    def clean(self):
        data = super().clean()
        now = timezone.now()
        data["group_by"] = data.get("group_by") or "team"
        data["until"] = data.get("until") or now
        data["since"] = data.get("since") or data["until"] - timedelta(days=7)
        # In UTC: offsets such as +17:30 parse in Python but PostgreSQL refuses them.
        data["since"], data["until"] = data["since"].astimezone(UTC), data["until"].astimezone(UTC)
        if data["since"] >= data["until"]:
            self.add_error("since", "must be before until")
        elif data["until"] - data["since"] > MAX_SPAN:
            self.add_error("since", f"the window may span at most {MAX_SPAN.days} days")
        return data
