"""Submitting reservations through the API: accepted shapes and refused ones, field by field."""

import pytest

from portal.fleet.model_names import fleet_models
from portal.reservations.models import Reservation, StateTransition

URL = "/api/v1/reservations/"


@pytest.fixture
def alice(client_for, fleet):
    return client_for("alice")


def test_fractional_request_is_stored_pending_with_audit(alice, reservation_body, people):
    r = alice.post(URL, reservation_body(gpu_limit=0.5, gpu_model="A100-80GB"), format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["state"] == "pending"
    assert body["team"] == "vision" and body["owner"] == "alice"
    assert body["gpu_request"] == 0.25 and body["gpu_limit"] == 0.5
    assert body["allocations"] == []
    row = Reservation.objects.get(pk=body["id"])
    assert [(t.from_state, t.to_state, t.actor_label) for t in row.transitions.all()] == [("", "pending", "alice")]


def test_limit_defaults_to_request(alice, reservation_body):
    r = alice.post(URL, reservation_body(gpu_request=0.3), format="json")
    assert r.status_code == 201
    assert r.json()["gpu_limit"] == 0.3


def test_whole_gpus_take_whole_cards(alice, reservation_body):
    r = alice.post(URL, reservation_body(gpu_count=2, gpu_request=1.0, gpu_memory_mib=40000), format="json")
    assert r.status_code == 201, r.content
    assert r.json()["gpu_limit"] == 1.0


@pytest.mark.parametrize(
    ("overrides", "field", "phrase"),
    [
        ({"gpu_request": 0}, "gpu_request", "greater than or equal to 0.001"),
        ({"gpu_request": 1.5}, "gpu_request", "less than or equal to 1"),
        ({"gpu_request": 0.5, "gpu_limit": 0.4}, "gpu_limit", "between gpu_request"),
        ({"gpu_count": 2, "gpu_request": 0.5}, "gpu_request", "whole cards"),
        ({"gpu_count": 9, "gpu_request": 1.0}, "gpu_count", "no node has 9 GPUs"),
        ({"gpu_memory_mib": 0}, "gpu_memory_mib", "greater than or equal to 1"),
        ({"gpu_model": "T4", "gpu_memory_mib": 20000}, "gpu_memory_mib", "more than a T4 card holds"),
        ({"gpu_model": "H100"}, "gpu_model", "unknown GPU model H100"),
        ({"priority": 101}, "priority", "less than or equal to 100"),
        ({"affinity": "bad label!"}, "affinity", "letters, digits"),
        ({"exclusion": "nope"}, "exclusion", "no exclusion group 'nope'"),
        ({"group_name": "g", "group_headcount": 0}, "group_headcount", "greater than or equal to 1"),
        ({"group_name": "g", "group_headcount": 2, "group_threshold": 1.5}, "group_threshold", "less than"),
        ({"group_headcount": 2}, "group_name", "required"),
        ({"image": "Not An Image"}, "image", "container image reference"),
        ({"team": "nlp"}, "team", "no team 'nlp' that you belong to"),
        ({"team": "ghost"}, "team", "no team 'ghost' that you belong to"),
        ({"kind": "forever"}, "kind", "not a valid choice"),
        ({"max_duration_s": 5}, "max_duration_s", "greater than or equal to 60"),
    ],
)
def test_invalid_fields_are_refused_by_name(alice, reservation_body, overrides, field, phrase):
    r = alice.post(URL, reservation_body(**overrides), format="json")
    assert r.status_code == 400, r.content
    errors = r.json()
    assert field in errors, errors
    assert phrase in " ".join(errors[field]), errors
    assert not Reservation.objects.exists()
    assert not StateTransition.objects.exists()


def test_model_set_accepts_any_listed_card(alice, reservation_body):
    r = alice.post(URL, reservation_body(gpu_model="T4|V100-32GB", gpu_memory_mib=30000), format="json")
    assert r.status_code == 201, r.content


def test_memory_beyond_largest_card_of_any_model_refused(alice, reservation_body):
    r = alice.post(URL, reservation_body(gpu_memory_mib=90000), format="json")
    assert r.status_code == 400
    assert "more than any card holds (81920 MiB)" in r.json()["gpu_memory_mib"][0]


def test_manager_cannot_submit(client_for, fleet, reservation_body):
    r = client_for("dave").post(URL, reservation_body(), format="json")
    assert r.status_code == 403
    assert not Reservation.objects.exists()


def test_unauthenticated_is_refused(fleet, reservation_body):
    from rest_framework.test import APIClient

    r = APIClient().post(URL, reservation_body(), format="json")
    assert r.status_code in (401, 403)
    assert APIClient().get(URL).status_code in (401, 403)


def _fleet_errors_reading_every_gpu(spec) -> dict:
    """What `rules.check` said of gpu_model and gpu_memory_mib when it grouped every GPU first."""

    known, wanted, errors = fleet_models(), spec.models(), {}
    unknown = [m for m in wanted if m not in known]
    if unknown:
        errors["gpu_model"] = [f"unknown GPU model {', '.join(unknown)}; known: {', '.join(sorted(known)) or 'none'}"]
    largest = max((known[m] for m in wanted if m in known), default=max(known.values(), default=0))
    if spec.gpu_memory_mib <= 0:
        errors["gpu_memory_mib"] = ["must be greater than 0"]
    elif spec.gpu_memory_mib > largest:
        what = f"a {'|'.join(wanted)}" if wanted else "any"
        errors["gpu_memory_mib"] = [f"{spec.gpu_memory_mib} MiB is more than {what} card holds ({largest} MiB)"]
    return errors


def test_fleet_check_answers_as_grouping_every_gpu_did(fleet, teams):
    """`check` asks the fleet one EXISTS (fleet_holds) and groups every GPU only to word a
    refusal: the same errors, in the same order, for any models and memory, on any fleet."""
    from portal.fleet.models import Gpu
    from portal.reservations import rules

    def errors_of(models: str, memory: int) -> dict:
        spec = rules.ReservationSpec(team=teams["vision"], image="busybox:1.36", gpu_request="0.5",
                                     gpu_memory_mib=memory, gpu_model=models)
        try:
            rules.check(spec)
        except rules.RuleViolation as refused:
            return refused.errors
        return {}

    models = ["", "A100-80GB", "T4", "H100", "T4|V100-32GB", "T4|H100", "H100|B200", "A100-80GB|T4|V100-32GB"]
    memories = [-1, 0, 1, 15360, 15361, 32768, 32769, 81920, 81921]
    for fleet_now in ("all", "A100s unhealthy and cordoned", "no T4", "none"):
        if fleet_now == "A100s unhealthy and cordoned":
            Gpu.objects.filter(model="A100-80GB").update(healthy=False, cordoned=True)  # still known
        elif fleet_now == "no T4":
            Gpu.objects.filter(model="T4").delete()
        elif fleet_now == "none":
            Gpu.objects.all().delete()
        for wanted in models:
            for memory in memories:
                spec = rules.ReservationSpec(team=teams["vision"], image="x", gpu_request="0.5", gpu_memory_mib=memory,
                                             gpu_model=wanted)
                got = errors_of(wanted, memory)
                assert got == _fleet_errors_reading_every_gpu(spec), (fleet_now, wanted, memory)
                assert list(got) == list(_fleet_errors_reading_every_gpu(spec))


def test_submit_over_a_token_costs_twelve_queries_and_answers_without_reading_allocations(
        people, fleet, reservation_body, django_assert_num_queries):
    """token (with the roles), the team by slug, the model named, the fleet check, the team
    locked with its policy, the departments with their quotas and the team's quotas (its hard
    limits), what the team holds (how it would count), the reservation and its audit row (in a
    savepoint here, a transaction in production); a reservation just submitted holds no GPUs, so
    its answer reads none."""
    from django.utils import timezone
    from rest_framework.test import APIClient

    from portal.tenancy.models import ApiToken
    from portal.tenancy.services import create_token

    token, key = create_token(people["alice"], "ci")
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    with django_assert_num_queries(12):
        r = client.post(URL, reservation_body(gpu_model="A100-80GB"), format="json")
    assert r.status_code == 201, r.content
    assert r.json()["allocations"] == [] and r.json()["team"] == "vision" and r.json()["owner"] == "alice"
    assert client.get(f"{URL}{r.json()['id']}/").json() == r.json()
