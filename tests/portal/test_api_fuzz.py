"""schemathesis against our own OpenAPI schema: no 5xx, no response that breaks the schema, and
invalid input refused, on every operation, as a site admin (who reaches every code path) and as a
team member (whose answers are the refusals and the narrower views)."""

import json

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import positive_data_acceptance

from portal.api.throttling import WriteRateThrottle
from portal.tenancy.services import create_token


def _schema():
    import django

    django.setup()
    from drf_spectacular.renderers import OpenApiJsonRenderer

    # Through the JSON renderer, exactly as /api/schema/ serves it (Decimals become numbers).
    spec = json.loads(OpenApiJsonRenderer().render(SchemaGenerator().get_schema(request=None, public=True)))
    loaded = schemathesis.openapi.from_dict(spec)
    loaded.app = get_wsgi_application()
    return loaded


schema = _schema()


@pytest.fixture(params=["admin", "alice"], ids=["site-admin", "member"])
def auth_headers(request, people, fleet, monkeypatch):
    # The fuzzer writes far faster than the production limit allows.
    monkeypatch.setattr(WriteRateThrottle, "THROTTLE_RATES", {"writes": "100000/min"})
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
    # positive_data_acceptance is left out on purpose: domain rules (known GPU models, memory of the
    # chosen card, quota) refuse some schema-valid requests with 400, as they must.
    headers = auth_headers
    header = case.meta.components.get(ParameterLocation.HEADER) if case.meta else None
    if header is not None and header.mode.is_negative:
        # The invalid part is the Authorization header (the token scheme): send it as generated,
        # for the API to refuse. Our token over it would make the request valid again, and
        # "invalid data accepted" would be reported against a request that was not invalid.
        headers = None
    case.call_and_validate(headers=headers, excluded_checks=[positive_data_acceptance])
