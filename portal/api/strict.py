"""JSON bodies must carry the types the schema promises: DRF would otherwise turn 0 into False,
42 into "42" and "1" into 1, which hides client bugs; and only the fields the schema names: DRF
would otherwise ignore a misspelt one (`idle_treshold`), and the request would succeed doing
less than asked. Read-only fields are known names and stay ignored, so a client may send back
what it read."""

from __future__ import annotations

from rest_framework import serializers

EXPECTED: list[tuple[type, tuple[type, ...], str]] = [
    # bool before integer: in Python a bool is an int.
    (serializers.BooleanField, (bool,), "true or false"),
    (serializers.IntegerField, (int,), "a whole number"),
    (serializers.DecimalField, (int, float, str), "a number"),
    (serializers.FloatField, (int, float), "a number"),
    (serializers.CharField, (str,), "a string"),
    (serializers.ChoiceField, (str,), "a string"),
    (serializers.ListField, (list,), "a list"),
    (serializers.RelatedField, (str,), "a string"),
]


def _check(field, value) -> str | None:
    if value is None:
        return None  # nullability is the field's own business
    for kind, types, words in EXPECTED:
        if isinstance(field, kind):
            if isinstance(value, bool) and bool not in types:
                return f"must be {words}"
            if not isinstance(value, types):
                return f"must be {words}"
            return None
    return None


class StrictTypesMixin:
    def to_internal_value(self, data):
        if isinstance(data, dict):
            allowed = ", ".join(sorted(name for name, field in self.fields.items() if not field.read_only))
            errors = {name: [f"unknown field; allowed: {allowed}"] for name in sorted(set(data) - set(self.fields))}
            for name, field in self.fields.items():
                if field.read_only or name not in data:
                    continue
                problem = _check(field, data[name])
                if problem:
                    errors[name] = [problem]
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)
