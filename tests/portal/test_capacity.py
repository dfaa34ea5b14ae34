"""`GET /api/v1/capacity/`: where a request could go now, and why not when it cannot."""

from decimal import Decimal

from portal.audit import services as audit
from portal.fleet import services as fleet_services
from portal.fleet.models import Gpu
from portal.reservations import rules, services

URL = "/api/v1/capacity/"


def test_lists_gpus_that_fit(client_for, fleet):
    r = client_for("alice").get(URL, {"gpu_request": "0.5", "gpu_memory_mib": 16000, "gpu_model": "V100-32GB"})
    assert r.status_code == 200
    body = r.json()
    assert body["fits"] is True
    assert {g["model"] for g in body["gpus"]} == {"V100-32GB"} and len(body["gpus"]) == 4


def test_full_gpus_drop_out(client_for, fleet, people, teams):
    for index in (0, 1):
        gpu = Gpu.objects.get(node__name="t4-node-1", index=index)
        res = services.submit(people["alice"], rules.ReservationSpec(
            team=teams["vision"], image="busybox:1.36", gpu_request=Decimal("0.75"), gpu_memory_mib=1000))
        services.place(res.pk, gpu.node_id, [services.NewAllocation(gpu.pk, Decimal("0.75"), 1000)])
    body = client_for("bob").get(URL, {"gpu_request": "0.5", "gpu_memory_mib": 1000, "gpu_model": "T4"}).json()
    assert body["fits"] is False and body["gpus"] == []
    assert "compute" in {r["code"] for r in body["reasons"]}
    small = client_for("bob").get(URL, {"gpu_request": "0.25", "gpu_memory_mib": 1000, "gpu_model": "T4"}).json()
    assert [g["free_share"] for g in small["gpus"]] == [0.25, 0.25]


def test_empty_answer_says_why(client_for, fleet):
    body = client_for("alice").get(URL, {"gpu_request": "0.5", "gpu_memory_mib": 20000, "gpu_model": "T4"}).json()
    assert body["fits"] is False and body["gpus"] == []
    assert any(r["code"] == "memory" for r in body["reasons"]), body


def test_beyond_the_quota_it_says_borrowed_and_where_nobody_lends_why_it_waits(client_for, fleet, teams):
    from portal.tenancy import quotas

    query = {"gpu_request": "1.0", "gpu_memory_mib": 1000, "gpu_count": 2, "team": "nlp"}
    body = client_for("bob").get(URL, query).json()
    assert body["fits"] is True and body["admission"] == "borrowed" and body["never"] is False
    for team in ("vision", "nlp"):
        quotas.replace_quotas(teams[team], audit.cli("test"), [
            {"gpu_model": "*", "gpu_share": "9" if team == "vision" else "1.5", "gpu_memory_gib": "900", "gpus": 18,
             "lending_limit": {"gpu_share": "0", "gpu_memory_gib": "0", "gpus": 0}}])
    body = client_for("bob").get(URL, query).json()
    assert body["fits"] is False and body["admission"] is None and body["gpus"] == []
    assert body["reasons"][0]["code"] == "quota"
    assert "nlp holds 0.0 of its 1.5 any-model (*) GPU share quota and this needs 2.0" in body["reasons"][0]["message"]


def test_bad_queries_are_400(client_for, fleet):
    alice = client_for("alice")
    assert "gpu_model" in alice.get(URL, {"gpu_request": "0.5", "gpu_memory_mib": 1, "gpu_model": "X"}).json()
    assert "gpu_request" in alice.get(URL, {"gpu_memory_mib": 1}).json()
    r = alice.get(URL, {"gpu_request": "0.5", "gpu_memory_mib": 1, "gpu_count": 2})
    assert r.status_code == 400 and "whole cards" in r.json()["gpu_request"][0]


def test_the_fleet_models_are_read_only_when_a_preview_names_models(client_for, fleet):
    """Grouping every GPU by model is for checking the models a preview names; one naming none
    does not pay for it (most previews), one naming an unknown model still gets its answer."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    alice = client_for("alice")
    alice.get(URL, {"gpu_request": "0.5", "gpu_memory_mib": 1})  # the fleet cached, as between requests
    with CaptureQueriesContext(connection) as plain:
        assert alice.get(URL, {"gpu_request": "0.5", "gpu_memory_mib": 1}).status_code == 200
    with CaptureQueriesContext(connection) as named:
        r = alice.get(URL, {"gpu_request": "0.5", "gpu_memory_mib": 1, "gpu_model": "H100-80GB"})
    assert r.status_code == 400 and r.json()["gpu_model"][0].startswith("unknown GPU model H100-80GB; known: ")

    def groups_gpus(queries):
        return [q["sql"] for q in queries if q["sql"].startswith('SELECT "fleet_gpu"."model" AS "model", MAX(')]

    assert groups_gpus(plain.captured_queries) == [] and len(groups_gpus(named.captured_queries)) == 1


def test_lists_the_best_gpus_up_to_the_limit_and_counts_them_all(client_for, fleet):
    query = {"gpu_request": "0.5", "gpu_memory_mib": 16000, "gpu_model": "V100-32GB"}
    everything = client_for("alice").get(URL, query).json()
    top = client_for("alice").get(URL, {**query, "limit": 2}).json()
    assert everything["count"] == 4 and top["count"] == 4 and top["fits"] is True
    assert top["gpus"] == everything["gpus"][:2]
    assert "limit" in client_for("alice").get(URL, {**query, "limit": 0}).json()


def test_a_gpu_changed_by_any_writer_shows_in_the_next_answer(client_for, fleet, people):
    """The fleet part of the snapshot is kept between answers; a change to a GPU row, through the
    fleet services or an update behind them (the agent ingest marks GPUs unhealthy that way), is
    in the very next answer."""
    query = {"gpu_request": "0.5", "gpu_memory_mib": 16000, "gpu_model": "V100-32GB"}
    first = client_for("alice").get(URL, query).json()
    cordoned, unhealthy = (Gpu.objects.get(uuid=g["uuid"]) for g in first["gpus"][:2])
    fleet_services.set_cordon(cordoned.pk, audit.web(people["admin"]), True)
    assert cordoned.uuid not in {g["uuid"] for g in client_for("alice").get(URL, query).json()["gpus"]}
    Gpu.objects.filter(pk=unhealthy.pk).update(healthy=False)
    after = client_for("alice").get(URL, query).json()
    assert {g["uuid"] for g in after["gpus"]} == {g["uuid"] for g in first["gpus"]} - {cordoned.uuid, unhealthy.uuid}
    assert after["count"] == 2


def test_the_fleet_version_moves_with_what_placement_reads_and_not_with_heartbeats(fleet):
    from django.db import connection
    from django.utils import timezone

    from portal.fleet.models import Node
    from portal.placement import fleet_cache

    if connection.vendor != "postgresql":
        return
    before = fleet_cache.version()
    Node.objects.update(last_seen=timezone.now())  # every agent's heartbeat
    assert fleet_cache.version() == before
    for change in (lambda: Gpu.objects.filter(pk=Gpu.objects.first().pk).update(memory_mib=1),
                   lambda: Node.objects.filter(pk=Node.objects.first().pk).update(labels={"zone": "b"}),
                   lambda: Gpu.objects.filter(pk=Gpu.objects.last().pk).delete()):
        change()
        assert fleet_cache.version() != before
        before = fleet_cache.version()


def test_a_version_seen_in_a_rolled_back_transaction_never_names_other_rows(fleet):
    from django.db import connection, transaction

    from portal.placement import fleet_cache

    if connection.vendor != "postgresql":
        return
    gpu = Gpu.objects.first()
    try:
        with transaction.atomic():
            Gpu.objects.filter(pk=gpu.pk).update(memory_mib=1)
            seen_inside = fleet_cache.version()
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    Gpu.objects.filter(pk=gpu.pk).update(memory_mib=2)
    assert fleet_cache.version() != seen_inside
