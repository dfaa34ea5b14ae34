"""CSV of a report: the same rows and totals as its JSON answer, with units in the headers.

`to_csv` is the one CSV writer of the portal: every export goes through it, so every text cell is
neutralised against formula injection (OWASP "CSV Injection"): a GPU model an agent reports, a
username or a reservation's name that starts with = + - @ (or a tab, CR, LF or NUL) would be
evaluated by the spreadsheet a manager opens; prefixed with a single quote it is shown as text.
Numbers stay numbers: a negative number or a signed decimal is no formula, and a quote would turn
it into text that no longer adds up.
"""

from __future__ import annotations

import csv
import io
import re
from decimal import Decimal

from rest_framework.renderers import BaseRenderer

GROUP_HEADERS = {"team": "team", "department": "department", "user": "user", "node": "node",
                 "gpu_model": "GPU model", "gpu": "GPU", "reservation": "reservation"}
QUOTA_GROUPS = ("team", "department")  # the groupings whose rows carry quota and lent GPU-hours


def usage_table(data: dict) -> tuple[list[str], list[list]]:
    """The usage report's rows and total. Grouped by team or department, also the unit's departments,
    its quota GPU-hours (from the current quota rows) and the GPU-hours it lent (reports.fairshare)."""
    device = data["total"]["device_busy_hours"] is not None
    quota = data["group_by"] in QUOTA_GROUPS
    by_reservation = data["group_by"] == "reservation"
    tz = data["time_zone"]
    who = (["reservation id", "name", "owner", "team", "GPU model", f"start ({tz})", f"end ({tz})"] if by_reservation
           else [GROUP_HEADERS[data["group_by"]]])
    header = (who + ["allocated (GPU-hours)", "used (GPU-hours)",
              "used / allocated (%)", "idle allocated (GPU-hours)", "burst above request (GPU-hours)",
              "borrowed beyond quota (GPU-hours)", "opportunistic (GPU-hours)"]
              + (["quota (GPU-hours, current quota rows)", "lent to others (GPU-hours)",
                  "department" if data["group_by"] == "team" else "within"] if quota else [])
              + (["device busy (hours)"] if device else []) + ["note"])

    def identity(r: dict) -> list:
        if not by_reservation:
            return [r["label"]]
        res = r.get("reservation")
        if res is None:  # the Total line
            return [r["label"]] + [""] * (len(who) - 1)
        return [res["id"], res["name"], res["owner"], res["team"], res["gpu_model"],
                _local(res["started_at"], tz), _local(res["finished_at"], tz)]

    def line(r: dict) -> list:
        return (identity(r) + [r["allocated_gpu_hours"], r["used_gpu_hours"], _blank(r["used_pct"]),
                 r["idle_allocated_gpu_hours"], r["burst_gpu_hours"], r["borrowed_gpu_hours"],
                 r["opportunistic_gpu_hours"]]
                + ([_blank(r["quota_gpu_hours"]), _blank(r["lent_gpu_hours"]), r["department"]] if quota else [])
                + ([r["device_busy_hours"]] if device else []) + [r["note"]])

    return header, [line(r) for r in data["rows"]] + [line(data["total"])]


def overview_table(data: dict) -> tuple[list[str], list[list]]:
    """The over-time series: one line per bucket and team, then the totals."""
    from zoneinfo import ZoneInfo

    from .services import bucket_labels

    series = data["series"]
    labels = bucket_labels(series["edges"], ZoneInfo(data["time_zone"]))
    header = [f"bucket start ({data['time_zone']})", "team", "allocated (GPU-hours)", "used (GPU-hours)"]
    rows = [[label, team, s["allocated"][i], s["used"][i]]
            for i, label in enumerate(labels) for team, s in sorted(series["teams"].items())]
    rows.append(["Total", "", data["total"]["allocated_gpu_hours"], data["total"]["used_gpu_hours"]])
    return header, rows


def _blank(x):
    return "" if x is None else x


def _local(at, tz: str) -> str:
    """A moment in the report's time zone, to the second ("" for none: not started, or not ended)."""
    from zoneinfo import ZoneInfo

    return "" if at is None else at.astimezone(ZoneInfo(tz)).strftime("%Y-%m-%d %H:%M:%S")


# What a spreadsheet reads as a formula when a cell starts with it (OWASP, ASVS 1.2.10).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n", "\0")
# A plain decimal number, as a spreadsheet reads one: -3, +0.5, -1.25e-3. Nothing in it can run.
_PLAIN_NUMBER = re.compile(r"[+-]?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def cell(value):
    """A value as a CSV cell: numbers as they are, text that would start a formula behind a `'`."""
    if isinstance(value, bool | int | float | Decimal) or value is None:
        return value
    text = str(value)
    if text.startswith(FORMULA_STARTS) and not _PLAIN_NUMBER.fullmatch(text):
        return "'" + text
    return text


def to_csv(header: list[str], rows: list[list]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow([cell(v) for v in header])
    writer.writerows([cell(v) for v in row] for row in rows)
    return out.getvalue()


class CsvRenderer(BaseRenderer):
    """`?format=csv`: the view says how its answer becomes a table (`csv_table`)."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        header, rows = (renderer_context or {})["view"].csv_table(data)
        return to_csv(header, rows)
