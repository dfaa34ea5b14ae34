"""Errors in the unit a field was typed in. The services check what the API takes (seconds, a
fraction of one GPU) and say so in those units; a page's field may be typed in hours, minutes or
percent, and its error must say "at most 4 h", not "at most 14400 s". Django's own numeric errors
("Ensure this value is less than or equal to 1024.") get the field's unit the same way."""

from __future__ import annotations

import re

from django import forms

HOURS, MINUTES, PERCENT = "h", "min", "%"
# The services' field names whose page fields are typed in another unit.
PAGE_UNITS = {
    "max_duration_s": HOURS, "interactive_max_s": HOURS, "limit_duration_s": HOURS,
    "idle_after_s": MINUTES, "idle_warning_s": MINUTES, "reclaim_grace_s": MINUTES,
    "limit_idle_after_s": MINUTES, "limit_idle_warning_s": MINUTES,
    "idle_threshold": PERCENT, "limit_idle_threshold": PERCENT,
}

_SECONDS_WITH_HOURS = re.compile(r"\b(\d+) s \([\d.]+ h\)")  # "14400 s (4 h)"
_SECONDS = re.compile(r"\b(\d+) s\b")
_BETWEEN = re.compile(r"\bbetween (\d+(?:\.\d+)?) and (\d+(?:\.\d+)?)\b")
_FRACTION_NOTE = re.compile(r" ?\(a fraction of one GPU\)")
_NUMBER = re.compile(r"(?<![\w.'\"])(\d+(?:\.\d+)?)(?![\w.'\"%])")


def _of_seconds(seconds: str, unit: str) -> str:
    per = 3600 if unit == HOURS else 60
    return f"{int(seconds) / per:g} {unit}"


def say_in(message: str, unit: str) -> str:
    """`message` about a value in seconds or a fraction, with its numbers in `unit`."""
    if unit in (HOURS, MINUTES):
        message = _SECONDS_WITH_HOURS.sub(lambda m: _of_seconds(m.group(1), unit), message)
        message = _SECONDS.sub(lambda m: _of_seconds(m.group(1), unit), message)
        return _BETWEEN.sub(lambda m: f"between {_of_seconds(m.group(1), unit).split()[0]} and "
                                      f"{_of_seconds(m.group(2), unit)}", message)
    if unit == PERCENT:
        message = _FRACTION_NOTE.sub("", message)
        return _NUMBER.sub(lambda m: f"{float(m.group(1)) * 100:g} %", message)
    return message


def page_errors(errors: dict[str, list[str]]) -> dict[str, list[str]]:
    """A service's errors, each in the unit its page field is typed in."""
    return {name: [say_in(m, PAGE_UNITS[name]) if name in PAGE_UNITS else m for m in problems]
            for name, problems in errors.items()}


def speak_units(form: forms.Form, units: dict[str, str]) -> None:
    """Give each numeric field of `form` errors in its own unit (`units`: field → "GiB", "h", …;
    a field not named has none), where the field does not say it better already."""
    for name, field in form.fields.items():
        if not isinstance(field, forms.IntegerField | forms.DecimalField):
            continue
        unit = units.get(name, "")
        after = f" {unit}" if unit else ""
        whole = not isinstance(field, forms.DecimalField)
        defaults = {
            "min_value": f"At least %(limit_value)s{after}.",
            "max_value": f"At most %(limit_value)s{after}.",
            "invalid": "Type a whole number" + (f" ({unit})." if unit else ".") if whole else
                       "Type a number" + (f" in {unit}, e.g. 1.5." if unit else ", e.g. 1.5."),
            "max_decimal_places": "Use at most %(max)s decimals.",
            "max_digits": "Too many digits: at most %(max)s.",
            "max_whole_digits": "Too many digits before the point: at most %(max)s.",
        }
        field.error_messages = defaults | {k: v for k, v in field.error_messages.items()
                                           if k not in defaults or k in _own_messages(field)}


def _own_messages(field) -> set[str]:
    """The codes whose message the field's author wrote (Django's defaults are not theirs)."""
    default = type(field)().error_messages
    return {k for k, v in field.error_messages.items() if default.get(k) != v}
