"""The smaller findings of the outside audit, each held to its fix: odd digits in paging, the
schema's nullable node, revoking twice, another team's allocations per GPU."""


import pytest
from drf_spectacular.generators import SchemaGenerator

from portal.fleet.models import Gpu
from portal.reservations.models import Reservation
from portal.tenancy.services import create_token
from tests.reservations import placed

ODD_NUMBERS = ["²", "١", "٣", "１", "1²", "9" * 5000, "-1", "0", "1.0", " 1", ""]


@pytest.mark.parametrize("value", ODD_NUMBERS)
@pytest.mark.parametrize("param", ["page", "page_size"])
def test_non_ascii_or_huge_numbers_in_paging_are_400(client_for, param, value):
    r = client_for("alice").get("/api/v1/reservations/", {param: value})
    assert r.status_code == 400, (param, value, r.status_code)
    assert param in r.json()


def test_plain_numbers_still_page(client_for):
    assert client_for("alice").get("/api/v1/reservations/", {"page": "1", "page_size": "20"}).status_code == 200


def test_schema_says_a_reservations_node_may_be_null(client_for, fleet, reservation_body):
    r = client_for("alice").post("/api/v1/reservations/", reservation_body(), format="json")
    assert r.status_code == 201 and r.json()["node"] is None  # what the API answers for a pending one
    schema = SchemaGenerator().get_schema(request=None, public=True)
    node = schema["components"]["schemas"]["Reservation"]["properties"]["node"]
    assert node.get("nullable") is True


def test_revoking_a_revoked_token_is_404(people, client_for):
    token, _ = create_token(people["alice"], "ci")
    alice = client_for("alice")
    assert alice.delete(f"/api/v1/tokens/{token.pk}/").status_code == 204
    assert alice.delete(f"/api/v1/tokens/{token.pk}/").status_code == 404
    assert alice.get("/api/v1/tokens/").json()["results"][0]["id"] == token.pk  # still listed, as revoked


def test_members_see_only_their_teams_allocations_per_gpu(client_for, fleet, reservation_body):
    gpu = Gpu.objects.get(node__name="t4-node-1", index=0)
    mine = client_for("alice").post("/api/v1/reservations/", reservation_body(gpu_request=0.25, gpu_memory_mib=1024),
                                    format="json").json()["id"]
    theirs = client_for("bob").post("/api/v1/reservations/",
                                    reservation_body(team="nlp", gpu_request=0.5, gpu_memory_mib=4096),
                                    format="json").json()["id"]
    placed(Reservation.objects.get(pk=mine), gpu)
    placed(Reservation.objects.get(pk=theirs), gpu)

    def row(who):
        results = client_for(who).get("/api/v1/gpus/", {"node__name": "t4-node-1"}).json()["results"]
        return next((g["allocated_request"], g["allocated_memory_mib"]) for g in results if g["index"] == 0)

    assert row("alice") == (0.25, 1024)
    assert row("bob") == (0.5, 4096)
    assert row("dave") == (0.25, 1024)  # vision's manager
    assert row("admin") == (0.75, 5120)

