"""/metrics: protected, Prometheus text, DCGM names for GPU series, shares and team totals."""

from __future__ import annotations

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from portal.telemetry import agent_batches, ingest, streams

from .conftest import hello_for, samples_for

pytestmark = pytest.mark.django_db


def _series(body: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


@pytest.fixture
def reporting(node, placed):
    hello = hello_for(node)
    info = streams.register_hello(node, hello)
    shares = [(placed["vision"].pk, 0, 0.375), (placed["nlp"].pk, 1, 0.2)]
    ingest.store_batches([agent_batches.reduce(info, samples_for(node, hello.stream, range(1, 3), util=55,
                                                              shares=shares))])
    return placed


def test_metrics_need_the_token_or_a_staff_session(client, people, settings):
    settings.TESSERA_METRICS_TOKEN = "s3cret-scrape-token"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    client.force_login(people["carol"])  # a team admin is not staff
    assert client.get("/metrics").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token").status_code == 200
    staff = Client()
    staff.force_login(people["admin"])
    assert staff.get("/metrics").status_code == 200


def test_metrics_report_gpus_shares_and_teams(reporting, people, node):
    client = Client()
    client.force_login(people["admin"])
    response = client.get("/metrics")
    assert response["Content-Type"].startswith("text/plain")
    series = _series(response.content.decode())
    gpu0 = node.gpus.get(index=0)
    labels = frozenset({"gpu": "0", "UUID": gpu0.uuid, "modelName": gpu0.model, "Hostname": node.name}.items())
    assert series[("DCGM_FI_DEV_GPU_UTIL", labels)] == 55
    assert series[("DCGM_FI_DEV_FB_USED", labels)] == 1000
    assert series[("DCGM_FI_DEV_FB_FREE", labels)] == gpu0.memory_mib - 1000
    share = frozenset({"reservation": str(reporting["vision"].pk), "team": "vision", "UUID": gpu0.uuid,
                       "Hostname": node.name}.items())
    assert series[("tessera_share_allocated_fraction", share)] == 0.5
    assert series[("tessera_share_used_fraction", share)] == 0.375
    assert series[("tessera_team_allocated_gpu_fraction", frozenset({"team": "nlp"}.items()))] == 0.25
    assert series[("tessera_team_used_gpu_fraction", frozenset({"team": "nlp"}.items()))] == 0.2
    assert series[("tessera_node_up", frozenset({"Hostname": node.name, "status": "ready"}.items()))] == 1
