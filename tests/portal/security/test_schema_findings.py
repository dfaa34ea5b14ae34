"""The schema says what the API answers and accepts: a pending reservation's `sharing` is within
its enum, the policy's and limits' ranges are stated (and refused in the service's words), and a
field the body should not have is refused by name instead of being silently ignored."""

from __future__ import annotations

import json
import re
from datetime import date

import pytest
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer

from portal.dates import DAY_PATTERN, FIRST_DAY, LAST_DAY
from portal.tenancy import policy
from portal.tenancy.models import TeamPolicy


@pytest.fixture(scope="module")
def schemas():
    spec = json.loads(OpenApiJsonRenderer().render(SchemaGenerator().get_schema(request=None, public=True)))
    return spec["components"]["schemas"]


def enum_of(schemas, prop: dict) -> set:
    refs = [prop["$ref"]] if "$ref" in prop else [p["$ref"] for p in prop.get("oneOf", prop.get("allOf", []))]
    return {v for ref in refs for v in schemas[ref.rsplit("/", 1)[1]]["enum"]} | set(prop.get("enum", []))


def test_a_pending_reservations_sharing_is_within_its_enum(client_for, fleet, reservation_body, schemas):
    body = client_for("alice").post("/api/v1/reservations/", reservation_body(), format="json").json()
    assert body["state"] == "pending" and body["sharing"] == ""
    assert enum_of(schemas, schemas["Reservation"]["properties"]["sharing"]) == {"", "exclusive", "local", "remote"}


@pytest.mark.parametrize("name", sorted(policy.WHOLE_NUMBERS))
def test_the_schema_states_each_settings_range(schemas, name):
    component = "PatchedLimitsRequest" if name.startswith("limit_") else "PatchedPolicyRequest"
    prop = schemas[component]["properties"][name]
    assert (prop["minimum"], prop["maximum"]) == policy.WHOLE_NUMBERS[name]
    assert prop.get("nullable", False) == (name in policy.NO_LIMIT_WHEN_BLANK)


@pytest.mark.parametrize(("component", "name"), [("PatchedPolicyRequest", "idle_threshold"),
                                                 ("PatchedLimitsRequest", "limit_idle_threshold")])
def test_the_schema_states_the_idle_thresholds_range(schemas, component, name):
    prop = schemas[component]["properties"][name]
    assert (prop["minimum"], prop["maximum"]) == (0, 1)


def test_the_policy_answer_has_a_schema(schemas, client_for, teams):
    answer = client_for("carol").get("/api/v1/teams/vision/policy/").json()
    described = schemas["PolicyAnswer"]["properties"]
    assert set(answer) == set(described)
    assert set(answer["limits"]) == set(schemas["PolicyLimitsAnswer"]["properties"])


@pytest.mark.parametrize(("who", "path", "body"), [
    ("carol", "/api/v1/teams/vision/policy/", {"idle_treshold": 0.2, "max_priority_member": 40}),
    ("admin", "/api/v1/teams/vision/limits/", {"limit_priorty": 10, "limit_duration_s": 7200}),
])
def test_a_patch_with_an_unknown_field_is_refused_naming_it(client_for, teams, who, path, body):
    r = client_for(who).patch(path, body, format="json")
    assert r.status_code == 400
    unknown = next(k for k in body if k not in policy.WHOLE_NUMBERS)
    assert set(r.json()) == {unknown} and "unknown field" in r.json()[unknown][0]
    assert not TeamPolicy.objects.filter(team=teams["vision"]).exists()  # nothing of the body was applied


def test_a_setting_out_of_its_range_is_refused_in_the_services_words(client_for, teams):
    r = client_for("carol").patch("/api/v1/teams/vision/policy/", {"max_priority_member": 101}, format="json")
    assert r.status_code == 400 and r.json() == {"max_priority_member": ["must be between 0 and 100"]}


def test_read_only_fields_sent_back_are_still_ignored(client_for, fleet, teams):
    carol = client_for("carol")
    preset = carol.post("/api/v1/presets/", {"team": "vision", "name": "nb", "image": "busybox:1",
                                            "gpu_request": "0.25", "gpu_memory_mib": 1024}, format="json").json()
    r = carol.patch(f"/api/v1/presets/{preset['id']}/", {**preset, "name": "notebook"}, format="json")
    assert r.status_code == 200 and r.json()["name"] == "notebook"


@pytest.fixture(scope="module")
def spec():
    return json.loads(OpenApiJsonRenderer().render(SchemaGenerator().get_schema(request=None, public=True)))


def query_schema(spec, path: str, name: str) -> dict:
    return next(p["schema"] for p in spec["paths"][path]["get"]["parameters"] if p["name"] == name)


@pytest.mark.parametrize(("name", "accepted"), [("a\x00b", False), ("   ", False), (" laptop ", True)])
def test_a_text_fields_pattern_refuses_what_the_api_refuses(client_for, schemas, name, accepted):
    pattern = schemas["NewTokenRequestRequest"]["properties"]["name"]["pattern"]
    assert bool(re.search(pattern, name)) is accepted
    answer = client_for("alice").post("/api/v1/tokens/", {"name": name}, format="json")
    assert answer.status_code == (201 if accepted else 400), answer.content


def test_a_text_filters_pattern_refuses_nul_as_the_api_does(client_for, spec, fleet):
    assert not re.search(query_schema(spec, "/api/v1/gpus/", "model")["pattern"], "A100\x00")
    assert client_for("alice").get("/api/v1/gpus/", {"model": "A100\x00"}).status_code == 400


def test_request_bodies_say_unknown_fields_are_refused(client_for, schemas, teams, people):
    assert schemas["NewTokenRequestRequest"]["additionalProperties"] is False
    assert schemas["ReservationRequest"]["additionalProperties"] is False
    answer = client_for("alice").post("/api/v1/tokens/", {"name": "ci", "scope": "all"}, format="json")
    assert answer.status_code == 400 and "scope" in answer.json()


def test_the_page_numbers_maximum_is_what_the_api_reads(client_for, spec, teams, people):
    assert query_schema(spec, "/api/v1/teams/", "page")["maximum"] == 999_999_999
    alice = client_for("alice")
    assert alice.get("/api/v1/teams/", {"page": 999_999_999}).status_code == 404  # a page past the last
    assert alice.get("/api/v1/teams/", {"page": 1_000_000_000}).status_code == 400


@pytest.mark.parametrize(("day", "status"), [("1970-01-01", 200), ("9998-12-31", 200), ("1969-12-31", 400),
                                             ("9999-01-01", 400), ("2024-02-29", 200), ("2023-02-29", 400),
                                             ("2100-02-29", 400), ("2000-02-29", 200), ("2026-04-31", 400),
                                             ("", 400)])
def test_the_audit_logs_date_pattern_is_its_range(client_for, spec, people, day, status):
    pattern = query_schema(spec, "/api/v1/audit/", "since")["pattern"]
    assert bool(re.search(pattern, day)) is (status == 200)
    assert client_for("admin").get("/api/v1/audit/", {"since": day}).status_code == status


@pytest.mark.parametrize("years", [range(1960, 2110), range(2395, 2405), range(9990, 10000)])
def test_the_day_pattern_is_the_calendar_within_the_range(years):
    for year in years:
        for month in range(1, 13):
            for day in range(1, 32):
                try:
                    valid = FIRST_DAY <= date(year, month, day) <= LAST_DAY
                except ValueError:
                    valid = False
                assert bool(re.match(DAY_PATTERN, f"{year:04d}-{month:02d}-{day:02d}")) is valid, (year, month, day)
