"""Numbers typed into the admin forms (hours, minutes, percentages). float() also reads 'inf',
'nan' and '1e400' (infinity), which no setting can hold and round() cannot turn into seconds: each
is refused like any other text that is not a number."""

from __future__ import annotations

import math


def finite(text: str) -> float:
    """`text` as a finite number; ValueError for anything else."""
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"not a finite number: {text!r}")
    return number


def whole_seconds(text: str, unit: int) -> int:
    """`text` units (3600: hours, 60: minutes) in whole seconds; ValueError if it is no number."""
    seconds = finite(text) * unit
    if not math.isfinite(seconds):  # 1e308 hours
        raise ValueError(f"too large: {text!r}")
    return round(seconds)


def hours_text(seconds) -> str:
    """Seconds as the hours a form shows ("" for none)."""
    if seconds in (None, ""):
        return ""
    return f"{int(seconds) / 3600:g}"


def seconds_from_hours(value: str, field: str, errors: dict):
    """Hours typed into `field` in whole seconds; None if blank, or if not a number (said in `errors`)."""
    value = (value or "").strip()
    if not value:
        return None
    try:
        return whole_seconds(value, 3600)
    except ValueError:
        errors.setdefault(field, []).append(f"a number of hours, e.g. 8 or 0.5 (got {value!r})")
        return None
