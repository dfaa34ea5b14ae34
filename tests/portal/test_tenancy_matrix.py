"""Every endpoint × every role × own team / other team. Other teams' objects answer 404 (their
existence is not leaked); visible objects a role may not change answer 403."""

import pytest

from portal.reservations import rules, services
from portal.tenancy.models import ApiToken, ExclusionGroup, Membership
from portal.tenancy.services import create_token

ROLES = ["alice", "carol", "dave", "bob", "erin", "admin"]  # vision member/admin/manager, nlp member/admin, staff


def spec(team, **kw):
    return rules.ReservationSpec(team=team, image="busybox:1.36", gpu_request=kw.pop("gpu_request", 0.25),
                                 gpu_memory_mib=1024, **kw)


@pytest.fixture
def world(fleet, teams, people):
    """A vision reservation of alice2 (alice's teammate) and an nlp reservation of bob."""
    from decimal import Decimal

    vision_r = services.submit(people["alice2"], spec(teams["vision"], gpu_request=Decimal("0.25")))
    nlp_r = services.submit(people["bob"], spec(teams["nlp"], gpu_request=Decimal("0.25")))
    return {"vision_r": vision_r, "nlp_r": nlp_r, "vision_m": Membership.objects.get(user=people["alice2"]),
            "vision_x": ExclusionGroup.objects.get(team=teams["vision"])}


# (method, url template, body, expected per role)
MATRIX = [
    ("get", "/api/v1/reservations/{vision_r}/", None,
     {"alice": 200, "carol": 200, "dave": 200, "bob": 404, "erin": 404, "admin": 200}),
    ("get", "/api/v1/reservations/{vision_r}/history/", None,
     {"alice": 200, "carol": 200, "dave": 200, "bob": 404, "erin": 404, "admin": 200}),
    ("post", "/api/v1/reservations/{vision_r}/cancel/", None,
     {"alice": 403, "carol": 200, "dave": 403, "bob": 404, "erin": 404, "admin": 200}),
    ("post", "/api/v1/reservations/{nlp_r}/cancel/", None,
     {"alice": 404, "carol": 404, "dave": 404, "bob": 200, "erin": 200, "admin": 200}),
    ("post", "/api/v1/reservations/", {"team": "vision", "image": "busybox:1.36", "gpu_request": 0.1,
                                       "gpu_memory_mib": 512},
     {"alice": 201, "carol": 201, "dave": 403, "bob": 400, "erin": 400, "admin": 201}),
    ("get", "/api/v1/teams/vision/", None,
     {"alice": 200, "carol": 200, "dave": 200, "bob": 404, "erin": 404, "admin": 200}),
    ("patch", "/api/v1/teams/vision/", {"quota_gpu_share": 9},
     {"alice": 403, "carol": 403, "dave": 403, "bob": 404, "erin": 404, "admin": 200}),
    ("post", "/api/v1/teams/", {"slug": "audio", "name": "Audio", "quota_gpu_share": 1, "quota_memory_mib": 1,
                                "quota_max_gpus": 1},
     {"alice": 403, "carol": 403, "dave": 403, "bob": 403, "erin": 403, "admin": 201}),
    ("get", "/api/v1/memberships/{vision_m}/", None,
     {"alice": 200, "carol": 200, "dave": 200, "bob": 404, "erin": 404, "admin": 200}),
    ("patch", "/api/v1/memberships/{vision_m}/", {"role": "admin"},
     {"alice": 403, "carol": 200, "dave": 403, "bob": 404, "erin": 404, "admin": 200}),
    ("delete", "/api/v1/memberships/{vision_m}/", None,
     {"alice": 403, "carol": 204, "dave": 403, "bob": 404, "erin": 404, "admin": 204}),
    ("post", "/api/v1/memberships/", {"team": "vision", "user": "erin", "role": "member"},
     {"alice": 403, "carol": 201, "dave": 403, "bob": 400, "erin": 400, "admin": 201}),
    ("get", "/api/v1/exclusion-groups/{vision_x}/", None,
     {"alice": 200, "carol": 200, "dave": 200, "bob": 404, "erin": 404, "admin": 200}),
    ("post", "/api/v1/exclusion-groups/", {"team": "vision", "label": "isolated"},
     {"alice": 403, "carol": 201, "dave": 403, "bob": 400, "erin": 400, "admin": 201}),
    ("delete", "/api/v1/exclusion-groups/{vision_x}/", None,
     {"alice": 403, "carol": 204, "dave": 403, "bob": 404, "erin": 404, "admin": 204}),
    ("get", "/api/v1/nodes/t4-node-1/", None, dict.fromkeys(ROLES, 200)),
    ("post", "/api/v1/nodes/t4-node-1/drain/", {"reason": "x"},
     {"alice": 403, "carol": 403, "dave": 403, "bob": 403, "erin": 403, "admin": 200}),
    ("get", "/api/v1/gpus/", None, dict.fromkeys(ROLES, 200)),
    ("get", "/api/v1/capacity/?gpu_request=0.5&gpu_memory_mib=1000&team=vision", None,
     {"alice": 200, "carol": 200, "dave": 200, "bob": 400, "erin": 400, "admin": 200}),
]


@pytest.mark.parametrize("who", ROLES)
@pytest.mark.parametrize(("method", "url", "body", "table"), MATRIX,
                         ids=[f"{m} {u.split('?')[0]}" for m, u, _, _ in MATRIX])
def test_matrix(client_for, world, who, method, url, body, table):
    target = url.format(vision_r=world["vision_r"].pk, nlp_r=world["nlp_r"].pk, vision_m=world["vision_m"].pk,
                        vision_x=world["vision_x"].pk)
    response = getattr(client_for(who), method)(target, body, format="json") if body is not None else \
        getattr(client_for(who), method)(target)
    assert response.status_code == table[who], (who, method, target, response.content)


@pytest.mark.parametrize(("who", "sees"), [
    ("alice", {"vision"}), ("carol", {"vision"}), ("dave", {"vision"}), ("bob", {"nlp"}), ("erin", {"nlp"}),
    ("admin", {"vision", "nlp"}),
])
def test_lists_show_only_visible_teams(client_for, world, who, sees):
    client = client_for(who)
    assert {r["team"] for r in client.get("/api/v1/reservations/").json()["results"]} == sees
    assert {t["slug"] for t in client.get("/api/v1/teams/").json()["results"]} == sees
    assert {m["team"] for m in client.get("/api/v1/memberships/").json()["results"]} <= sees
    assert {x["team"] for x in client.get("/api/v1/exclusion-groups/").json()["results"]} <= sees
    # Filtering by another team's slug shows nothing rather than an error that confirms it exists.
    other = ({"vision", "nlp"} - sees) or set()
    for slug in other:
        assert client.get("/api/v1/reservations/", {"team": slug}).json()["count"] == 0


def test_tokens_are_private(client_for, people):
    token, _ = create_token(people["bob"], "bob-cli")
    alice = client_for("alice")
    assert alice.get("/api/v1/tokens/").json()["count"] == 0
    assert alice.delete(f"/api/v1/tokens/{token.pk}/").status_code == 404
    assert ApiToken.objects.get(pk=token.pk).revoked_at is None


def test_unauthenticated_everywhere(world):
    from rest_framework.test import APIClient

    anon = APIClient()
    for _, url, _, _ in MATRIX:
        target = url.format(vision_r=1, nlp_r=2, vision_m=1, vision_x=1)
        assert anon.get(target).status_code in (401, 403), target
    assert anon.get("/api/schema/").status_code in (401, 403)
