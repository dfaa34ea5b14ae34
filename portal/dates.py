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
