"""API tokens: obtained with a password, used as `Authorization: Token <key>`, stored hashed,
revocable."""

from rest_framework.test import APIClient

from portal.tenancy.models import ApiToken, hash_secret


def test_password_gets_a_token_that_works_until_revoked(people):
    anon = APIClient()
    r = anon.post("/api/v1/auth/token/", {"username": "alice", "password": "pw-alice", "name": "laptop"},
                  format="json")
    assert r.status_code == 201, r.content
    key = r.json()["key"]
    row = ApiToken.objects.get(pk=r.json()["id"])
    assert row.key_hash == hash_secret(key) and key not in (row.key_hash, row.prefix)

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/v1/reservations/").status_code == 200
    listed = client.get("/api/v1/tokens/").json()["results"]
    assert [t["name"] for t in listed] == ["laptop"] and "key" not in listed[0]

    assert client.delete(f"/api/v1/tokens/{row.pk}/").status_code == 204
    assert client.get("/api/v1/reservations/").status_code == 401


def test_wrong_password_and_bad_tokens_are_refused(people):
    anon = APIClient()
    r = anon.post("/api/v1/auth/token/", {"username": "alice", "password": "nope"}, format="json")
    assert r.status_code == 401
    assert not ApiToken.objects.exists()
    assert anon.post("/api/v1/auth/token/", {"username": "alice"}, format="json").status_code == 400
    for header in ("Token", "Token abc def", "Token not-a-real-key", "Bearer whatever"):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=header)
        assert client.get("/api/v1/teams/").status_code in (401, 403), header


def test_inactive_user_token_stops_working(people):
    from portal.tenancy.services import create_token

    _, key = create_token(people["bob"], "ci")
    people["bob"].is_active = False
    people["bob"].save()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/v1/teams/").status_code == 401


def test_created_token_is_shown_once(client_for):
    alice = client_for("alice")
    r = alice.post("/api/v1/tokens/", {"name": "notebook"}, format="json")
    assert r.status_code == 201 and len(r.json()["key"]) > 30
    assert "key" not in alice.get("/api/v1/tokens/").json()["results"][0]
