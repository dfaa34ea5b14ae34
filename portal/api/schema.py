"""OpenAPI post-processing: document the error answers every operation can give, so clients (and
the schema fuzzer) know them: 400 per-field errors, 401/403 auth, 404 hidden or missing, 409
conflicts, 429 throttled."""

from __future__ import annotations

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
