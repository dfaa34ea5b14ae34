"""schemathesis against our own OpenAPI schema: no 5xx, no response that breaks the schema, and
invalid input refused, on every operation, as a site admin (who reaches every code path) and as a
team member (whose answers are the refusals and the narrower views). Every check runs: valid data
must be accepted too, except where DOMAIN_REFUSALS names a rule OpenAPI cannot state."""

import json

import jsonschema
import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import negative_data_rejection

from portal.api.throttling import WriteRateThrottle
from portal.tenancy.services import create_token

ACCEPTED = ["2xx", "401", "403", "404", "5xx"]  # schemathesis' default for valid data (5xx: not_a_server_error)
# Schema-valid requests that domain rules refuse, which OpenAPI cannot state: each operation with the
# answers those rules give (documented in its responses) and the rules.
DOMAIN_REFUSALS = {
    ("POST", "/api/v1/reservations/"): (["400", "409"], "the team must be one of yours; the GPU model must be in "
                                        "the fleet and the memory fit its cards; labels must exist; quota (409)"),
    ("POST", "/api/v1/presets/"): (["400"], "the team must be one of yours; the GPU model must be in the fleet"),
    ("POST", "/api/v1/memberships/"): (["400"], "the team must be one of yours; the user must exist, not yet a member"),
    ("POST", "/api/v1/exclusion-groups/"): (["400"], "the team must be one of yours; labels are unique per team"),
    ("POST", "/api/v1/affinity-labels/"): (["400"], "the team must be one of yours; labels are unique per team"),
    ("POST", "/api/v1/departments/"): (["400"], "slugs are unique; the parent must exist, at most 4 levels deep"),
    ("POST", "/api/v1/teams/"): (["400"], "slugs are unique; the department must be one you may see"),
    ("GET", "/api/v1/capacity/"): (["400"], "the GPU model must be in the fleet, the team one of yours, the "
                                   "exclusion group the team's; multi-GPU requests take whole cards"),
    ("GET", "/api/v1/reports/usage/"): (["400"], "the team must be one whose reports you see; range or since/until, "
                                        "since before until, at most 400 days; an IANA time zone"),
    ("GET", "/api/v1/reports/overview/"): (["400"], "as reports/usage"),
    ("GET", "/api/v1/audit/"): (["400"], "since before until"),
    ("GET", "/api/v1/workloads/"): (["400"], "since before until; the team and user must be ones you may see"),
    ("GET", "/api/v1/bookings/"): (["400"], "from before to, within the calendar (90 days ahead)"),
    ("POST", "/api/v1/nodes/{name}/drains/"): (["400", "409"], "a start now or up to 90 days ahead, an end a "
                                               "minute to 30 days after it, a reason; no overlap with another plan "
                                               "of the node; bookings it breaks (409) unless forced"),
    ("POST", "/api/v1/tokens/"): (["409"], "one live token per name: a name in use is refused unless replaced"),
    ("POST", "/api/v1/auth/token/"): (["409"], "as tokens: one live token per name"),
}


def _schema():
    import django

    django.setup()
    from drf_spectacular.renderers import OpenApiJsonRenderer

    # Through the JSON renderer, exactly as /api/schema/ serves it (Decimals become numbers).
    spec = json.loads(OpenApiJsonRenderer().render(SchemaGenerator().get_schema(request=None, public=True)))
    loaded = schemathesis.openapi.from_dict(spec, config=SchemathesisConfig.from_dict({"operations": [
        {"include-name": f"{method} {path}",
         "checks": {"positive_data_acceptance": {"expected-statuses": [*ACCEPTED, *statuses]}}}
        for (method, path), (statuses, _rule) in DOMAIN_REFUSALS.items()]}))
    loaded.app = get_wsgi_application()
    return loaded


schema = _schema()


@pytest.fixture(params=["admin", "alice"], ids=["site-admin", "member"])
def auth_headers(request, people, fleet, monkeypatch, settings):
    # The fuzzer writes far faster than the production limit allows, and signs in with wrong
    # passwords far more often than the sign-in throttle lets through (a 429 there is that
    # throttle doing its work, tested in tests/portal/security, not a finding).
    monkeypatch.setattr(WriteRateThrottle, "THROTTLE_RATES", {"writes": "100000/min"})
    settings.TESSERA_SIGNIN_FAILURES_PER_USERNAME = "100000/15m"
    settings.TESSERA_SIGNIN_FAILURES_PER_ADDRESS = "100000/15m"
    _, key = create_token(people[request.param], "fuzz")
    # Requests go through the real WSGI handler inside the test's transaction: keep Django from
    # closing that connection at the end of each request (its own test client does the same).
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield {"Authorization": f"Token {key}"}
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.mark.django_db
@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case, auth_headers):
    headers = auth_headers
    header = case.meta.components.get(ParameterLocation.HEADER) if case.meta else None
    if header is not None and header.mode.is_negative:
        # The invalid part is the Authorization header (the token scheme): send it as generated,
        # for the API to refuse. Our token over it would make the request valid again, and
        # "invalid data accepted" would be reported against a request that was not invalid.
        headers = None
    excluded = []
    if _negative_only_in_what_is_not_sent(case):
        excluded = [negative_data_rejection]  # the request sent is a valid one: nothing to refuse
    case.call_and_validate(headers=headers, excluded_checks=excluded)


def _negative_only_in_what_is_not_sent(case) -> bool:
    """schemathesis may make a query invalid only by adding a parameter whose value is an empty list,
    which no query string can carry (`?page_size=1` is sent for {"page_size": 1, "": []}): the
    request is then valid on the wire. True for those cases, checked against the parameters' schemas."""
    query = case.query or {}
    components = case.meta.components if case.meta else {}
    if [loc for loc, c in components.items() if c.mode.is_negative] != [ParameterLocation.QUERY]:
        return False
    sent = {name: value for name, value in query.items() if value != []}
    if sent == query:
        return False
    schema = {"type": "object", "additionalProperties": False,
              "properties": {p.name: p.definition["schema"] for p in case.operation.query},
              "required": [p.name for p in case.operation.query if p.is_required]}
    return jsonschema.Draft4Validator(schema).is_valid(sent)
