"""Failed sign-ins are throttled per username and per client address, before any password is
hashed; X-Forwarded-For counts only through the trusted proxies."""

import pytest
from django.contrib.auth.hashers import MD5PasswordHasher
from django.test import Client
from rest_framework.test import APIClient

from portal.security.addresses import client_address


class CountingHasher(MD5PasswordHasher):
    algorithm = "md5"
    calls = 0

    def verify(self, password, encoded):
        CountingHasher.calls += 1
        return super().verify(password, encoded)


@pytest.fixture
def counting_hasher(settings):
    settings.PASSWORD_HASHERS = [f"{__name__}.CountingHasher"]
    CountingHasher.calls = 0
    return CountingHasher


@pytest.fixture
def limits(settings):
    settings.TESSERA_SIGNIN_FAILURES_PER_USERNAME = "3/15m"
    settings.TESSERA_SIGNIN_FAILURES_PER_ADDRESS = "5/15m"


def _token(username, password, address="10.0.0.1", **headers):
    return APIClient(REMOTE_ADDR=address, **headers).post(
        "/api/v1/auth/token/", {"username": username, "password": password, "name": "laptop", "replace": True},
        format="json")


def test_wrong_password_flood_stops_hashing_and_answers_429(people, limits, counting_hasher,
                                                             django_assert_num_queries):
    answers = [_token("alice", f"guess-{i}").status_code for i in range(20)]
    assert answers[:3] == [401] * 3 and set(answers[3:]) == {429}
    with django_assert_num_queries(0):  # refused before any database work: the flood takes no connection
        assert _token("alice", "guess-again").status_code == 429
    # Django hashes once per failed attempt (also for unknown users); none after the limit.
    assert counting_hasher.calls <= 3
    r = _token("alice", "pw-alice")
    assert r.status_code == 429 and int(r["Retry-After"]) > 0  # the right password too, until it passes


def test_per_username_limit_holds_across_addresses(people, limits):
    for i in range(3):
        assert _token("alice", "nope", address=f"10.0.1.{i}").status_code == 401
    assert _token("alice", "pw-alice", address="10.0.9.9").status_code == 429
    assert _token("bob", "pw-bob", address="10.0.9.9").status_code == 201  # another user is unaffected


def test_per_address_limit_holds_across_usernames(people, limits):
    for i in range(5):
        assert _token(f"nobody{i}", "nope").status_code == 401
    assert _token("alice", "pw-alice").status_code == 429
    assert _token("alice", "pw-alice", address="10.0.0.2").status_code == 201


def test_successful_sign_ins_are_not_counted(people, limits):
    for _ in range(8):
        assert _token("alice", "pw-alice").status_code == 201


def test_html_login_and_admin_login_throttled(people, limits):
    client = Client(REMOTE_ADDR="10.0.3.3")
    for _ in range(3):
        assert client.post("/login/", {"username": "carol", "password": "nope"}).status_code == 200
    r = client.post("/login/", {"username": "carol", "password": "pw-carol"})
    assert r.status_code == 429 and int(r["Retry-After"]) > 0
    r = client.post("/admin/login/", {"username": "carol", "password": "pw-carol"})
    assert r.status_code == 429
    assert "_auth_user_id" not in client.session


def test_spoofed_forwarded_for_does_not_escape_the_address_throttle(people, limits, settings):
    settings.TESSERA_TRUSTED_PROXIES = 0
    for i in range(5):
        assert _token(f"x{i}", "nope", HTTP_X_FORWARDED_FOR=f"203.0.113.{i}").status_code == 401
    assert _token("alice", "pw-alice", HTTP_X_FORWARDED_FOR="198.51.100.7").status_code == 429


def test_forwarded_for_counts_through_trusted_proxies_only(settings):
    settings.TESSERA_TRUSTED_PROXIES = 0
    meta = {"REMOTE_ADDR": "10.1.1.1", "HTTP_X_FORWARDED_FOR": "6.6.6.6, 203.0.113.5"}
    assert client_address(meta) == "10.1.1.1"
    settings.TESSERA_TRUSTED_PROXIES = 1  # one ingress: it appended the address it saw
    assert client_address(meta) == "203.0.113.5"
    settings.TESSERA_TRUSTED_PROXIES = 2
    assert client_address({"REMOTE_ADDR": "10.1.1.1", "HTTP_X_FORWARDED_FOR": "6.6.6.6, 203.0.113.5, 10.2.2.2"}) \
        == "203.0.113.5"
    assert client_address({"REMOTE_ADDR": "10.1.1.1", "HTTP_X_FORWARDED_FOR": "203.0.113.5"}) == "203.0.113.5"


def test_behind_a_proxy_clients_are_told_apart(people, limits, settings):
    settings.TESSERA_TRUSTED_PROXIES = 1
    for i in range(5):
        assert _token(f"x{i}", "nope", HTTP_X_FORWARDED_FOR="6.6.6.6, 203.0.113.9").status_code == 401
    assert _token("alice", "pw-alice", HTTP_X_FORWARDED_FOR="203.0.113.10").status_code == 201
    assert _token("bob", "pw-bob", HTTP_X_FORWARDED_FOR="1.2.3.4, 203.0.113.9").status_code == 429
