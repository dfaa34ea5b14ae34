"""The demo password and the demo people work only in demo mode: not by API token, nor /login/,
nor /admin/, nor an old session or token; `check --deploy` names them."""

import pytest
from django.contrib.auth import get_user_model
from django.core import checks
from django.core.management import call_command
from django.test import Client
from rest_framework.test import APIClient

from portal.security.demo import DEMO_PASSWORD
from portal.tenancy.services import create_token


@pytest.fixture
def seeded(db, settings):
    settings.DEMO_MODE = True
    call_command("seed_demo", stdout=open("/dev/null", "w"))  # noqa: SIM115
    return get_user_model().objects.get(username="admin")


def _token_answer(username, password):
    return APIClient().post("/api/v1/auth/token/", {"username": username, "password": password, "name": "laptop"},
                            format="json").status_code


def _web_login(path, username, password):
    client = Client()
    client.post(path, {"username": username, "password": password})
    return "_auth_user_id" in client.session


def test_demo_password_signs_in_only_in_demo_mode(seeded, settings):
    assert _token_answer("alice", DEMO_PASSWORD) == 201
    assert _web_login("/login/", "alice", DEMO_PASSWORD)
    assert _web_login("/admin/login/", "admin", DEMO_PASSWORD)

    settings.DEMO_MODE = False
    assert _token_answer("alice", DEMO_PASSWORD) == 401
    assert not _web_login("/login/", "alice", DEMO_PASSWORD)
    assert not _web_login("/admin/login/", "admin", DEMO_PASSWORD)


def test_demo_user_with_another_password_still_refused_outside_demo_mode(seeded, settings):
    carol = get_user_model().objects.get(username="carol")
    carol.set_password("a-new-password-carol-chose")
    carol.save()
    settings.DEMO_MODE = False
    assert _token_answer("carol", "a-new-password-carol-chose") == 401
    assert not _web_login("/login/", "carol", "a-new-password-carol-chose")


def test_any_user_with_the_demo_password_refused_outside_demo_mode(people, settings):
    settings.DEMO_MODE = False
    people["bob"].set_password(DEMO_PASSWORD)
    people["bob"].save()
    assert _token_answer("bob", DEMO_PASSWORD) == 401
    assert _token_answer("alice", "pw-alice") == 201  # an ordinary user signs in as before


def test_demo_users_old_token_and_session_stop_working_outside_demo_mode(seeded, settings):
    alice = get_user_model().objects.get(username="alice")
    _, key = create_token(alice, "laptop")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    web = Client()
    web.force_login(alice)
    assert api.get("/api/v1/teams/").status_code == 200
    assert web.get("/api/v1/teams/").status_code == 200

    settings.DEMO_MODE = False
    assert api.get("/api/v1/teams/").status_code == 401
    assert web.get("/api/v1/teams/").status_code == 401  # the session's user is anonymous now


def _deploy_messages():
    return {m.id: m for m in checks.run_checks(include_deployment_checks=True, tags=[checks.Tags.security])}


def test_check_deploy_flags_demo_users(seeded, settings):
    settings.DEMO_MODE = False
    found = _deploy_messages()
    assert "tessera.E001" in found
    assert "alice" in found["tessera.E001"].msg and "admin" in found["tessera.E001"].msg


def test_check_deploy_finds_demo_users_seeded_before_they_were_marked(people, settings):
    settings.DEMO_MODE = False
    people["dave"].set_password(DEMO_PASSWORD)
    people["dave"].save()
    found = _deploy_messages()
    assert "dave" in found["tessera.E001"].msg and "alice" not in found["tessera.E001"].msg


def test_check_deploy_quiet_without_demo_users(people, settings):
    settings.DEMO_MODE = False
    assert not {"tessera.E001", "tessera.W001"} & set(_deploy_messages())
