"""The API tokens page: your tokens by name, a new one's key shown once, revoking your own only."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from rest_framework.test import APIClient

from portal.tenancy.models import ApiToken
from portal.tenancy.services import create_token

pytestmark = pytest.mark.django_db


def client(people, who: str) -> Client:
    c = Client()
    c.force_login(people[who])
    return c


def test_make_a_token_and_see_its_key_once(people):
    c = client(people, "alice")
    r = c.post("/tokens/", {"name": "laptop"})
    assert r.status_code == 200 and "no-store" in r["Cache-Control"]
    key = re.search(r'id="new-key" class="token-key" value="([^"]+)"', r.content.decode()).group(1)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert api.get("/api/v1/teams/").status_code == 200  # the key shown works
    listing = c.get("/tokens/").content.decode()
    assert 'data-token="laptop"' in listing and key not in listing and key[:8] in listing
    assert "never" not in listing  # it was just used: last used is shown


def test_a_name_in_use_is_refused_with_why_unless_replaced(people):
    c = client(people, "alice")
    token, _ = create_token(people["alice"], "laptop")
    r = c.post("/tokens/", {"name": "laptop"})
    assert r.status_code == 400
    assert f"You already have a token named &#x27;laptop&#x27; (starting {token.prefix}" in r.content.decode()
    assert ApiToken.objects.filter(user=people["alice"]).count() == 1
    r = c.post("/tokens/", {"name": "laptop", "replace": "on"})
    assert r.status_code == 200 and f"({token.prefix}…), now revoked" in r.content.decode()
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None


def test_a_blank_name_says_so(people):
    r = client(people, "alice").post("/tokens/", {"name": ""})
    assert r.status_code == 400 and "Give the token a name, e.g. laptop or ci." in r.content.decode()


def test_revoke_your_own_token_only(people):
    mine, key = create_token(people["alice"], "ci")
    theirs, _ = create_token(people["bob"], "ci")
    c = client(people, "alice")
    assert c.post(f"/tokens/{theirs.pk}/revoke/").status_code == 404
    assert ApiToken.objects.get(pk=theirs.pk).revoked_at is None
    assert c.post(f"/tokens/{mine.pk}/revoke/").status_code == 302
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert api.get("/api/v1/teams/").status_code == 401
    assert c.post(f"/tokens/{mine.pk}/revoke/").status_code == 404  # revoked already
    page = c.get("/tokens/").content.decode()
    assert "You have no live token." in page and "Revoked tokens (1)" in page


def test_the_page_lists_only_your_tokens(people):
    create_token(people["bob"], "bobs-secret-job")
    assert "bobs-secret-job" not in client(people, "alice").get("/tokens/").content.decode()
    assert Client().get("/tokens/").status_code == 302  # signed out: to the sign-in page
