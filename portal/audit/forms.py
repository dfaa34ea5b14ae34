"""The audit log's filters, read the same way by its page (/audit/) and its API (/api/v1/audit/):
each refused with a message naming what is wrong (a date out of range, a NUL character, a page
beyond the last one the page reads) instead of reaching the database as it came."""

from __future__ import annotations

from django import forms

from portal.dates import day_problem

DAY_FORMAT = "a date as YYYY-MM-DD"
# The page merges the two logs in Python, reading page × 50 entries of each: far pages are for
# the date filters, not for paging.
LAST_PAGE = 1000


class DayField(forms.DateField):
    input_formats = ["%Y-%m-%d"]
    default_error_messages = {"invalid": DAY_FORMAT}

    def validate(self, value):
        super().validate(value)
        problem = value and day_problem(value)
        if problem:
            raise forms.ValidationError(problem)


class AuditQuery(forms.Form):
    # CharField refuses NUL characters (PostgreSQL text cannot hold them): a 400, not a 500.
    team = forms.CharField(required=False, max_length=50)
    user = forms.CharField(required=False, max_length=150)
    object_type = forms.CharField(required=False, max_length=32)
    object_id = forms.CharField(required=False, max_length=64)
    since = DayField(required=False)
    until = DayField(required=False)

    def clean(self):
        data = super().clean()
        since, until = data.get("since"), data.get("until")
        if since and until and since > until:
            self.add_error("since", f"the range ends before it starts: {since} is after {until}; give the earlier "
                                    "day first")
        return data

    def problems(self) -> dict[str, list[str]]:
        """Each refused filter with its messages."""
        return {name: list(messages) for name, messages in self.errors.items()}


class AuditPageQuery(AuditQuery):
    """The page's filters: the API pages with its paginator instead."""

    page = forms.IntegerField(required=False, min_value=1, max_value=LAST_PAGE, error_messages={
        "invalid": "a page number, 1 or more",
        "max_value": f"the page shows up to page {LAST_PAGE}; narrow the dates to read older entries"})
