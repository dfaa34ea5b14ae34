"""Output through one set of bound fields per serializer class instead of one per serializer.

DRF deep-copies and binds every declared field, and introspects the model for the others, each
time a serializer is made: for a reservation's ~40 fields that was ~1 ms per answer, plus a new
nested serializer per reservation for its allocations. The fields' output does not depend on
which serializer holds them, so a class that opts in renders through fields built once, with
DRF's own `get_attribute` and `to_representation` of each field wherever a value is not plain
(tests compare the JSON with DRF's generic path).

Three steps are taken without DRF's per-field call, for the same result: a plain dotted source
is read with one attrgetter; an aware datetime of a plain DateTimeField is converted with the
time zone looked up once per rendering (DRF looks it up per field, ~15 µs each on our servers,
more than the rest of the field); a Decimal that DecimalField's quantizing would return as it is
(a numeric column's value, already at the field's scale) is returned without it.

Only for serializers whose output reads neither the request nor the context (no hyperlinks,
no method field that looks at `self.context`): the shared fields belong to a serializer that has
neither."""

from __future__ import annotations

import datetime
import threading
from decimal import Decimal
from operator import attrgetter

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.utils import timezone
from rest_framework import ISO_8601
from rest_framework.fields import DecimalField, SkipField
from rest_framework.settings import api_settings

from portal import internals

_lock = threading.Lock()
_PK_ONLY = internals.PK_ONLY_OBJECT  # a missing related object renders as None
_plans: dict[type, tuple] = {}  # serializer class → its shared fields' plan (see _plan)
_UNSET = object()


def _fast_getter(field):
    """attrgetter for a plain dotted source; None where DRF's own lookup must run (the whole
    object, a related field that may hand out a pk-only stand-in)."""
    if field.source == "*" or internals.hands_out_pk_only(field):
        return None
    return attrgetter(field.source)


def _exact_decimal(field) -> tuple[int, int] | None:
    """(decimal places, max digits) of a DecimalField that outputs the quantized Decimal itself
    (no string, no normalizing), else None."""
    if (type(field) is DecimalField and getattr(field, "coerce_to_string", None) is False
            and getattr(field, "normalize_output", True) is False
            and field.decimal_places is not None and field.max_digits is not None):
        return field.decimal_places, field.max_digits
    return None


def _plan(serializer_class) -> tuple:
    plan = _plans.get(serializer_class)
    if plan is None:
        with _lock:
            plan = _plans.get(serializer_class)
            if plan is None:
                shared = serializer_class()  # no instance, no context: what every field renders with
                plan = tuple((name, _fast_getter(field), field.get_attribute, field.to_representation,
                              internals.default_datetime_output(field), _exact_decimal(field))
                             for name, field in shared.fields.items() if not field.write_only)
                _plans[serializer_class] = plan
    return plan


def output_zone():
    """The zone DateTimeField.to_representation converts to now, or None where it would not
    write ISO 8601 in a zone (then each field runs its own)."""
    if not settings.USE_TZ:
        return None
    output_format = api_settings.DATETIME_FORMAT
    if not isinstance(output_format, str) or output_format.lower() != ISO_8601:
        return None
    return timezone.get_current_timezone()


def represent(serializer_class, instance, zone=_UNSET) -> dict:
    """`Serializer.to_representation(instance)`, step for step, with the class's shared fields.
    The fast lookup falls back to the field's own whenever it meets anything but a plain value
    (a missing attribute or related row, a callable), so defaults and errors stay DRF's.
    `zone`: output_zone(), when the caller renders many."""
    ret = {}
    for name, fast_get, get_attribute, to_representation, plain_datetime, exact_decimal in _plan(serializer_class):
        try:
            if fast_get is None:
                raise AttributeError
            attribute = fast_get(instance)
            if callable(attribute):
                raise AttributeError
        except (AttributeError, KeyError, ObjectDoesNotExist):
            try:
                attribute = get_attribute(instance)
            except SkipField:
                continue
        if attribute is None or (isinstance(attribute, _PK_ONLY) and attribute.pk is None):
            ret[name] = None
        elif plain_datetime and (zone := output_zone() if zone is _UNSET else zone) is not None \
                and (text := _iso(attribute, zone)) is not None:
            ret[name] = text
        elif exact_decimal and _quantized(attribute, *exact_decimal):
            ret[name] = attribute  # DecimalField.quantize would give it back as it is
        else:
            ret[name] = to_representation(attribute)
    return ret


def _quantized(value, places: int, max_digits: int) -> bool:
    """Whether `value` is a Decimal with exactly `places` decimal places and at most `max_digits`
    digits, which quantizing to `places` within `max_digits` leaves as it is (what a numeric
    column of that scale reads as). DRF's quantize costs ~7 µs here, this check under one."""
    if type(value) is not Decimal:
        return False
    _sign, digits, exponent = value.as_tuple()
    return exponent == -places and len(digits) <= max_digits


def _iso(value, zone) -> str | None:
    """DateTimeField.to_representation of an aware datetime in ISO 8601 (None: not one of those,
    or out of range, which the field reports itself)."""
    if not isinstance(value, datetime.datetime) or value.utcoffset() is None:
        return None
    try:
        text = value.astimezone(zone).isoformat()
    except OverflowError:
        return None
    return text[:-6] + "Z" if text.endswith("+00:00") else text


class SharedFieldsRepresentation:
    # Mixin for a serializer: render through the class's shared fields (see the module). No
    # docstring: drf-spectacular would take it as the description of every serializer using it.

    def to_representation(self, instance):
        return represent(type(self), instance)
