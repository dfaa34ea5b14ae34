"""A node lost under running reservations: their page and card say so (and why) while they still
run; where no cluster watches the nodes (the local backend), a node whose agent went silent loses
its reservations like one the cluster reports NotReady; on a cluster that watches its nodes the
silent agent alone ends nothing."""

from __future__ import annotations

import pytest
from django.test import Client

from portal.fleet import services as fleet
from portal.fleet.models import LostCause
from portal.placement.reconcile import reconcile
from portal.reservations.models import Reservation
from portal.reservations.states import State


@pytest.fixture
def run_one(client_for, reservation_body, placement_loop):
    def make() -> Reservation:
        response = client_for("alice").post("/api/v1/reservations/", reservation_body(gpu_request=0.5),
                                            format="json")
        placement_loop()
        r = Reservation.objects.select_related("node").get(pk=response.json()["id"])
        assert r.state == State.RUNNING, r.state_reason
        return r
    return make


class WatchingCluster:
    """The local cluster as a backend whose cluster watches its nodes (as Kubernetes does)."""

    watches_nodes = True

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_page_and_card_say_the_node_is_lost_while_it_runs(run_one, people):
    r = run_one()
    fleet.mark_lost(r.node_id, LostCause.AGENT_SILENT, "no agent report for 90 s")
    page = Client()
    page.force_login(people["alice"])
    summary = page.get(f"/reservations/{r.pk}/").content.decode()
    assert f"Node {r.node.name} is lost</strong>: no agent report for 90 s" in summary
    card = page.get(f"/reservations/{r.pk}/card/").content.decode()
    assert f'data-node-lost="{r.node.name}"' in card and "nothing measures it now" in card


def test_silent_agent_loses_reservations_where_no_cluster_watches_the_nodes(run_one, cluster):
    r = run_one()
    pod, node = r.pod_name, r.node.name
    fleet.mark_lost(r.node_id, LostCause.AGENT_SILENT, "no agent report for 90 s")
    report = reconcile(cluster)
    r.refresh_from_db()
    assert r.state == State.PENDING and report.nodes_lost == [node]  # the team requeues on node loss
    assert r.state_reason == f"requeued: node {node} was lost: no agent report for 90 s"
    assert all(p.name != pod or p.deleting for p in cluster.list_pods())


def test_silent_agent_alone_ends_nothing_where_the_cluster_watches_the_nodes(run_one, cluster):
    r = run_one()
    fleet.mark_lost(r.node_id, LostCause.AGENT_SILENT, "no agent report for 90 s")
    reconcile(WatchingCluster(cluster))
    r.refresh_from_db()
    assert r.state == State.RUNNING
