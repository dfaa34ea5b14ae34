"""API tokens: obtained with a password, used as `Authorization: Token <key>`, stored hashed,
revocable."""

from datetime import timedelta

from django.test import override_settings
from django.utils import timezone
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
    r = anon.post("/api/v1/auth/token/", {"username": "alice", "password": "nope", "name": "laptop"}, format="json")
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


def _fields(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


def test_one_query_gives_the_token_its_user_and_their_roles_as_the_orm_reads_them(people, teams,
                                                                                  django_assert_num_queries):
    """The token lookup is one hand-written statement (every API request pays for it): what it
    gives must be what the ORM gives, field by field, and the roles must be team_roles' own."""
    from django.contrib.auth.models import Group

    from portal.security import demo
    from portal.tenancy import roles
    from portal.tenancy.authentication import HashedTokenAuthentication
    from portal.tenancy.models import Membership, Role
    from portal.tenancy.services import create_token

    carol = people["carol"]
    Membership.objects.create(user=carol, team=teams["nlp"], role=Role.MANAGER)
    carol.groups.add(Group.objects.create(name="unrelated"))
    for person in (carol, people["admin"], people["bob"]):
        token, key = create_token(person, "ci")
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())  # no touch below
        with django_assert_num_queries(1):
            user, got = HashedTokenAuthentication().authenticate_credentials(key)
            got_roles = roles.team_roles(user)
        expected = ApiToken.objects.select_related("user").get(pk=token.pk)
        assert _fields(got) == _fields(expected) and got.user is user
        assert _fields(user) == _fields(expected.user)
        assert type(user.last_login) is type(expected.user.last_login)
        roles.forget_roles(expected.user)
        assert got_roles == roles.team_roles(expected.user)
        assert user.is_demo_user is False and not user._state.adding
    demo.mark_demo_user(people["bob"])
    _, key = create_token(people["bob"], "demo")
    with override_settings(DEMO_MODE=True):
        user, _ = HashedTokenAuthentication().authenticate_credentials(key)
    assert user.is_demo_user is True and roles.team_roles(user) == {teams["nlp"].pk: Role.MEMBER}


def test_a_token_in_use_is_touched_once_a_minute(people, django_assert_num_queries):
    from portal.tenancy.authentication import HashedTokenAuthentication
    from portal.tenancy.services import create_token

    token, key = create_token(people["alice"], "ci")
    with django_assert_num_queries(2):  # the lookup, and last_used_at (never used yet)
        HashedTokenAuthentication().authenticate_credentials(key)
    touched = ApiToken.objects.get(pk=token.pk).last_used_at
    assert touched is not None and abs((timezone.now() - touched).total_seconds()) < 60
    with django_assert_num_queries(1):
        HashedTokenAuthentication().authenticate_credentials(key)
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=touched - timedelta(minutes=2))
    with django_assert_num_queries(2):
        HashedTokenAuthentication().authenticate_credentials(key)


def test_revocation_membership_and_deactivation_count_from_the_next_request(people, teams):
    """Nothing about a token is kept between requests."""
    from portal.tenancy.models import Membership
    from portal.tenancy.services import create_token

    _, key = create_token(people["alice"], "ci")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert [t["slug"] for t in client.get("/api/v1/teams/").json()["results"]] == ["vision"]
    Membership.objects.filter(user=people["alice"]).delete()
    assert client.get("/api/v1/teams/").json()["results"] == []
    Membership.objects.create(user=people["alice"], team=teams["nlp"])
    assert [t["slug"] for t in client.get("/api/v1/teams/").json()["results"]] == ["nlp"]
    ApiToken.objects.update(revoked_at=timezone.now())
    r = client.get("/api/v1/teams/")
    assert r.status_code == 401 and r.json()["detail"] == "Invalid or revoked token."
    ApiToken.objects.update(revoked_at=None)
    people["alice"].is_active = False
    people["alice"].save()
    r = client.get("/api/v1/teams/")
    assert r.status_code == 401 and r.json()["detail"] == "User inactive or deleted."


def test_team_roles_reads_memberships_alone(people, django_assert_num_queries):
    """Session users' roles: one query on the membership table, without the joins its model's
    default ordering would add."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from portal.tenancy import roles

    vision = people["carol"].memberships.get().team_id
    with CaptureQueriesContext(connection) as captured:
        assert roles.team_roles(people["carol"]) == {vision: "admin"}
        roles.team_roles(people["carol"])
    assert len(captured.captured_queries) == 1
    assert "JOIN" not in captured.captured_queries[0]["sql"].upper()


def _sign_in(**extra):
    return APIClient().post("/api/v1/auth/token/", {"username": "alice", "password": "pw-alice", **extra},
                            format="json")


def test_token_sign_in_needs_a_name(people):
    r = _sign_in()
    assert r.status_code == 400
    assert r.json()["name"] == ["give the token a name (e.g. laptop or ci): your tokens are listed by name"]
    assert _sign_in(name="  ").status_code == 400
    assert not ApiToken.objects.exists()


def test_signing_in_twice_with_one_name_mints_nothing_silently(people):
    first = _sign_in(name="laptop").json()
    again = _sign_in(name="laptop")
    assert again.status_code == 409
    assert f"you already have a token named 'laptop' (starting {first['prefix']}" in again.json()["name"][0]
    assert ApiToken.objects.filter(user=people["alice"]).count() == 1

    replaced = _sign_in(name="laptop", replace=True)
    assert replaced.status_code == 201 and replaced.json()["replaced"] == first["prefix"]
    old = APIClient()
    old.credentials(HTTP_AUTHORIZATION=f"Token {first['key']}")
    assert old.get("/api/v1/teams/").status_code == 401  # the replaced key no longer works
    new = APIClient()
    new.credentials(HTTP_AUTHORIZATION=f"Token {replaced.json()['key']}")
    assert new.get("/api/v1/teams/").status_code == 200
    assert _sign_in(name="ci").json()["replaced"] is None


def test_the_tokens_endpoint_refuses_a_second_live_name_too(client_for):
    alice = client_for("alice")
    made = alice.post("/api/v1/tokens/", {"name": "notebook"}, format="json").json()
    assert alice.post("/api/v1/tokens/", {"name": "notebook"}, format="json").status_code == 409
    assert alice.delete(f"/api/v1/tokens/{made['id']}/").status_code == 204
    assert alice.post("/api/v1/tokens/", {"name": "notebook"}, format="json").status_code == 201  # revoked: free
