"""The days a filter may name (reports, the audit log).

A window's edges are computed from the day given (the day after it, midnight in a time zone,
then UTC); near the ends of Python's calendar (year 1, year 9999) that arithmetic overflows, so
days outside a range where it always fits are refused with a message, not a 500. Nothing the
portal records is older than the Unix epoch, so the range starts there.
"""

from __future__ import annotations

from datetime import date

FIRST_DAY = date(1970, 1, 1)
LAST_DAY = date(9998, 12, 31)


def day_problem(day: date) -> str | None:
    """What is wrong with `day` as a filter's date (None: nothing)."""
    if not FIRST_DAY <= day <= LAST_DAY:
        return f"{day.isoformat()} is out of range; give a date from {FIRST_DAY} to {LAST_DAY}"
    return None


# The days from FIRST_DAY to LAST_DAY as YYYY-MM-DD, for schemas: years 1970 to 9998, each month's
# days, 29 February in leap years only (no lookarounds, so every regex engine and generator reads it).
_YEAR = r"(?:19[7-9][0-9]|[2-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])"
_MONTH_DAY = r"(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)"
_LEAP_YEAR = r"(?:19(?:7[26]|8[048]|9[26])|[2-9][0-9](?:0[48]|[2468][048]|[13579][26])|(?:[2468][048]|[3579][26])00)"
DAY_PATTERN = rf"^(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)$"
