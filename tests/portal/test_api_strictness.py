"""Inputs the API refuses instead of guessing: unknown or empty query parameters, wrong JSON types,
bad pages, other content types."""

import pytest


@pytest.fixture
def alice(client_for, fleet):
    return client_for("alice")


def test_unknown_query_parameter_is_named(alice):
    r = alice.get("/api/v1/reservations/", {"stat": "pending"})
    assert r.status_code == 400
    assert "unknown query parameter" in r.json()["stat"][0]


@pytest.mark.parametrize("params", [{"state": ""}, {"page": "0"}, {"page": "x"}, {"page_size": "0"},
                                    {"page_size": "100000"}])
def test_meaningless_values_are_refused(alice, params):
    assert alice.get("/api/v1/reservations/", params).status_code == 400


@pytest.mark.parametrize(("field", "value", "words"), [
    ("gpu_memory_mib", "8192", "whole number"), ("gpu_count", True, "whole number"), ("image", 42, "string"),
    ("requeue_on_preempt", 1, "true or false"), ("command", "python x.py", "list"),
])
def test_wrong_json_types_are_refused(alice, reservation_body, field, value, words):
    r = alice.post("/api/v1/reservations/", reservation_body(**{field: value}), format="json")
    assert r.status_code == 400
    assert words in r.json()[field][0]


def test_form_encoded_bodies_are_refused(alice):
    r = alice.post("/api/v1/reservations/", {"team": "vision"})  # multipart
    assert r.status_code == 415


def test_unknown_api_path_answers_json(alice):
    r = alice.get("/api/v1/nothing-here/")
    assert r.status_code == 404 and r["Content-Type"].startswith("application/json")
