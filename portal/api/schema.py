"""OpenAPI post-processing: document the error answers every operation can give, so clients (and
the schema fuzzer) know them: 400 per-field errors, 401/403 auth, 404 hidden or missing, 409
conflicts, 429 throttled."""

from __future__ import annotations

from drf_spectacular import openapi
from rest_framework import serializers
from rest_framework.fields import ProhibitNullCharactersValidator

from .strict import StrictTypesMixin

ERROR = {
    "type": "object",
    "description": "`detail` says what is wrong; 400 answers map each bad field to its messages instead.",
    "properties": {"detail": {"type": "string"}, "code": {"type": "string"}},
    "additionalProperties": True,
}

STANDARD = {
    "400": "Invalid input: each bad field with its messages",
    "401": "Not authenticated (missing, wrong or revoked credentials)",
    "403": "Authenticated, but your role may not do this",
    "404": "Not found, or not visible to you (other teams' objects); also an out-of-range page",
    "429": "Too many writes; retry after the time in Retry-After",
}


def add_error_responses(result, generator, request, public):
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR
    ref = {"$ref": "#/components/schemas/Error"}
    for methods in result.get("paths", {}).values():
        for operation in methods.values():
            responses = operation.setdefault("responses", {})
            for code, text in STANDARD.items():
                responses.setdefault(code, {"description": text, "content": {"application/json": {"schema": ref}}})
    return result


# DRF's and Django's CharFields refuse NUL characters (PostgreSQL text cannot hold them), and a
# trimmed CharField that may not be blank refuses whitespace only: the schema says so, so that
# clients (and the fuzzer) know such strings are invalid rather than find out from a 400.
NO_NUL = "^[^\\u0000]*$"
NOT_BLANK = "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$"


def _string_without_constraint(schema: dict) -> bool:
    return schema.get("type") == "string" and not {"enum", "pattern", "format"} & set(schema)


class AutoSchema(openapi.AutoSchema):
    def _map_basic_serializer(self, serializer, direction):
        schema = super()._map_basic_serializer(serializer, direction)
        if direction == "request" and isinstance(serializer, StrictTypesMixin):
            schema["additionalProperties"] = False  # StrictTypesMixin refuses fields it does not name
        return schema

    def _map_serializer_field(self, field, direction, bypass_extensions=False):
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        if (direction == "request" and isinstance(field, serializers.CharField) and isinstance(schema, dict)
                and _string_without_constraint(schema)
                and any(isinstance(v, ProhibitNullCharactersValidator) for v in field.validators)):
            schema["pattern"] = NO_NUL if field.allow_blank or not field.trim_whitespace else NOT_BLANK
        return schema

    def _get_filter_parameters(self):
        # django-filter reads text filters with forms.CharField, which refuses NUL the same way.
        parameters = super()._get_filter_parameters()
        for parameter in parameters:
            schema = parameter.get("schema", {})
            if parameter.get("in") == "query" and _string_without_constraint(schema):
                schema["pattern"] = NO_NUL
        return parameters
