"""The report query, for the API and the pages alike: what to group by, which teams, and the
window (a named range, or since/until as dates or date-times, read in the given time zone)."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django import forms
from django.conf import settings
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from portal.dates import day_problem

from .services import GROUPS
from .window import RANGES, Window

MAX_SPAN = timedelta(days=400)
WHEN_HELP = "a date (2026-11-16) or a date and time (2026-11-16T09:30, optionally with an offset such as +01:00)"
PARAMS = {"group_by", "range", "since", "until", "tz", "team"}


class ReportQuery(forms.Form):
    group_by = forms.ChoiceField(choices=[(g, g.replace("_", " ")) for g in GROUPS], required=False)
    range = forms.ChoiceField(choices=[("", "custom")] + [(r, r) for r in RANGES], required=False,
                              help_text="24h, 7d or 30d up to now; or give since and until")
    since = forms.CharField(required=False, max_length=40, help_text=WHEN_HELP)
    until = forms.CharField(required=False, max_length=40, help_text=WHEN_HELP + "; a date includes that day")
    tz = forms.CharField(required=False, max_length=64, help_text="IANA time zone, e.g. Europe/Paris")
    team = forms.SlugField(required=False, max_length=50)

    def clean_tz(self) -> ZoneInfo:
        name = self.cleaned_data.get("tz") or settings.TIME_ZONE
        try:
            return ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise forms.ValidationError(
                f"unknown time zone '{name}'; use an IANA name such as Europe/Paris or UTC") from None

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        tz: ZoneInfo = data["tz"]
        data["group_by"] = data.get("group_by") or "team"
        since_text, until_text = data.get("since", ""), data.get("until", "")
        if data.get("range") and (since_text or until_text):
            raise forms.ValidationError("give either range or since/until, not both")
        now = timezone.now()
        if since_text or until_text:
            until = _when(self, "until", until_text, tz, end_of_day=True) if until_text else now
            since = _when(self, "since", since_text, tz) if since_text else None
            if self.errors:
                return data
            since = since or until - RANGES["7d"]
        else:
            until = now
            since = until - RANGES[data.get("range") or "7d"]
        if since >= until:
            ends = f"{until_text}" if until_text else "now"
            self.add_error("since", f"the window ends before it starts: {since_text} is after {ends}; "
                                    "give the earlier day first")
        elif until - since > MAX_SPAN:
            self.add_error("since", f"the window may span at most {MAX_SPAN.days} days")
        data["window"] = Window(since=since, until=until, tz=tz)
        return data


def _when(form: forms.Form, name: str, text: str, tz: ZoneInfo, end_of_day: bool = False) -> datetime | None:
    """A date is that day's midnight in `tz` (for until: the next midnight, so the day is included);
    a date-time without an offset is wall-clock time in `tz`. Always returned in UTC."""
    try:
        day = parse_date(text)
        at = None if day else parse_datetime(text)
    except ValueError:
        day = at = None
    if day is None and at is None:
        form.add_error(name, f"'{text}' is not {WHEN_HELP}")
        return None
    problem = day_problem(day or at.date())  # before the arithmetic below, which overflows near year 9999
    if problem:
        form.add_error(name, problem)
        return None
    if day is not None:
        at = datetime.combine(day + timedelta(days=1) if end_of_day else day, time(0), tzinfo=tz)
    elif at.tzinfo is None:
        at = at.replace(tzinfo=tz)
    # In UTC: offsets such as +17:30 parse in Python but PostgreSQL refuses them.
    return at.astimezone(UTC)
