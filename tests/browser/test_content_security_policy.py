"""Under the strict Content-Security-Policy the pages work in a real browser and the browser
reports no violation: no inline script, no eval, no injected style element anywhere we serve."""

import os

import pytest
from django.contrib.auth import get_user_model

from portal.fleet import inventory
from portal.tenancy.models import Membership, Role
from tests.teams import make_team

from .stack import sign_in

pytestmark = pytest.mark.browser


@pytest.fixture
def people(chromium, transactional_db, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    inventory.load(os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "inventory", "demo.yaml"))
    team = make_team("vision", "Vision", quota_gpu_share=2)
    carol = get_user_model().objects.create_user("carol", password="s3cret-carol", is_staff=True,
                                                  is_superuser=True)
    Membership.objects.create(user=carol, team=team, role=Role.ADMIN)


def _watch_violations(page) -> list[str]:
    seen: list[str] = []
    page.on("console", lambda m: seen.append(f"{page.url}: {m.text}") if "Content Security Policy" in m.text else None)
    page.on("pageerror", lambda e: seen.append(f"page error: {e}"))
    return seen


def test_pages_run_under_the_policy_without_violations(page, live_server, people):
    violations = _watch_violations(page)
    base = live_server.url
    sign_in(page, base, "carol", "s3cret-carol")
    for path in ("/", "/reservations/new/", "/notifications/", "/notifications/settings/", "/api/docs/", "/admin/"):
        response = page.goto(f"{base}{path}")
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy.split("style-src-attr")[0]
        page.wait_for_load_state("networkidle")
        if path == "/":
            assert page.evaluate("typeof window.htmx") == "object"  # our scripts ran
        if path == "/api/docs/":
            page.wait_for_selector(".swagger-ui .information-container")  # Swagger UI rendered
    assert violations == []
    # An inline script is refused, as an injected one would be.
    page.goto(f"{base}/")
    page.evaluate("""() => { const s = document.createElement('script');
        s.textContent = 'window.__injected = 1'; document.body.appendChild(s); }""")
    assert page.evaluate("window.__injected") is None
    assert violations and all("inline script" in v for v in violations)
