"""`poll()` turns the pod and node watches into reservation-relevant events, and keeps doing so
through expired watches (410 Gone) and API server errors."""

from __future__ import annotations

import time

from scheduler.backends import NodeEvent, Phase, PodEvent, PodRef


def collect(backend, until, timeout_s=15.0):
    """Events from poll() until `until(events)` holds; fails the test after `timeout_s`."""
    seen = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen.extend(backend.poll(0.2))
        if until(seen):
            return seen
    raise AssertionError(f"timed out; events so far: {seen}")


def watches_open(server, count=2, timeout_s=15.0):
    """Wait until the backend's pod and node watches are being served (not between requests)."""
    deadline = time.monotonic() + timeout_s
    while server.open_watches < count:
        assert time.monotonic() < deadline, "the watches never opened"
        time.sleep(0.02)


def pod_events(events, name):
    return [e for e in events if isinstance(e, PodEvent) and e.pod.name == name]


def phases(events, name):
    return [e.pod.phase for e in pod_events(events, name) if not e.deleted]


def test_pod_phases_become_events_with_the_reservation_and_the_reason(nodes, backend, pod_spec):
    backend.bind(pod_spec())
    collect(backend, lambda ev: Phase.PENDING in phases(ev, "tessera-r42-1"))
    nodes.set_pod_phase("tessera", "tessera-r42-1", "Running")
    collect(backend, lambda ev: Phase.RUNNING in phases(ev, "tessera-r42-1"))
    nodes.set_pod_phase("tessera", "tessera-r42-1", "Failed", container_reason="OOMKilled")
    events = collect(backend, lambda ev: Phase.FAILED in phases(ev, "tessera-r42-1"))
    (failed,) = [e for e in pod_events(events, "tessera-r42-1") if e.pod.phase == Phase.FAILED]
    assert failed.pod.reservation_id == "42" and failed.pod.reason == "OOMKilled"


def test_a_pod_deleted_from_outside_is_reported_deleted(nodes, backend, pod_spec):
    backend.bind(pod_spec())
    collect(backend, lambda ev: pod_events(ev, "tessera-r42-1"))
    nodes.remove_pod("tessera", "tessera-r42-1")
    events = collect(backend, lambda ev: any(e.deleted for e in pod_events(ev, "tessera-r42-1")))
    (gone,) = [e for e in pod_events(events, "tessera-r42-1") if e.deleted]
    assert gone.pod.reservation_id == "42"


def test_pods_without_a_reservation_label_are_not_reported(nodes, backend, pod_spec):
    nodes.create_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "default"},
                      "spec": {"containers": [{"name": "c", "image": "nginx"}]}})
    backend.bind(pod_spec())
    events = collect(backend, lambda ev: pod_events(ev, "tessera-r42-1"))
    nodes.set_pod_phase("default", "web", "Running")
    events += backend.poll(1.0)
    assert pod_events(events, "web") == []


def test_a_node_that_goes_not_ready_is_reported_once_per_change(nodes, backend):
    collect(backend, lambda ev: {e.node.name for e in ev if isinstance(e, NodeEvent)} == {"gpu-node-1", "gpu-node-2"})
    nodes.set_node_ready("gpu-node-2", False)
    nodes.set_node_ready("gpu-node-2", False)  # a heartbeat that changes nothing
    events = collect(backend, lambda ev: any(isinstance(e, NodeEvent) for e in ev))
    events += backend.poll(0.5)
    node_events = [e.node for e in events if isinstance(e, NodeEvent)]
    assert [(n.name, n.ready, n.reason) for n in node_events] == [("gpu-node-2", False, "NodeStatusUnknown")]


def test_an_expired_watch_relists_and_reports_what_changed_meanwhile(nodes, backend, pod_spec):
    backend.bind(pod_spec(reservation_id="1"))
    backend.bind(pod_spec(reservation_id="2"))
    collect(backend, lambda ev: pod_events(ev, "tessera-r1-1") and pod_events(ev, "tessera-r2-1"))
    relists = backend.watch.relists
    # While the watch hears nothing, one pod runs, the other disappears, and history is compacted.
    watches_open(nodes)
    nodes.pause_watches(True)
    nodes.set_pod_phase("tessera", "tessera-r1-1", "Running")
    nodes.remove_pod("tessera", "tessera-r2-1")
    nodes.compact()
    nodes.pause_watches(False)
    collect(backend, lambda ev: Phase.RUNNING in phases(ev, "tessera-r1-1")
                     and any(e.deleted for e in pod_events(ev, "tessera-r2-1")))
    assert backend.watch.relists > relists


def test_the_watch_rides_out_api_server_errors(nodes, backend, pod_spec):
    backend.bind(pod_spec())
    collect(backend, lambda ev: pod_events(ev, "tessera-r42-1"))
    watches_open(nodes)
    nodes.inject("GET", r"^/api/v1/pods\?watch$", status=500, times=1)
    nodes.inject("GET", r"^/api/v1/pods$", status=503, times=2)
    nodes.end_watches()  # the running watch ends; the next one meets the faults
    nodes.set_pod_phase("tessera", "tessera-r42-1", "Succeeded")
    events = collect(backend, lambda ev: Phase.SUCCEEDED in phases(ev, "tessera-r42-1"))
    assert nodes.faults_left() == 0  # every fault was met on the way
    assert [e for e in pod_events(events, "tessera-r42-1") if e.deleted] == []


def test_unbind_then_deletion_is_reported(nodes, backend, pod_spec):
    backend.bind(pod_spec())
    collect(backend, lambda ev: pod_events(ev, "tessera-r42-1"))
    backend.unbind(PodRef("tessera", "tessera-r42-1"), grace_s=0, reason="cancelled")
    events = collect(backend, lambda ev: any(e.deleted for e in pod_events(ev, "tessera-r42-1")))
    deleting = [e.pod.deleting for e in pod_events(events, "tessera-r42-1")]
    assert deleting[-1] is True


def test_a_late_poll_reports_the_current_state_not_a_replay_of_history(nodes, backend, pod_spec):
    backend.bind(pod_spec())
    collect(backend, lambda ev: pod_events(ev, "tessera-r42-1")
            and {e.node.name for e in ev if isinstance(e, NodeEvent)} == {"gpu-node-1", "gpu-node-2"})
    # Nobody polls while a node flaps and the pod runs to completion (another worker was busy).
    nodes.set_node_ready("gpu-node-2", False)
    nodes.set_node_ready("gpu-node-2", True)
    nodes.set_pod_phase("tessera", "tessera-r42-1", "Running")
    nodes.set_pod_phase("tessera", "tessera-r42-1", "Succeeded")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # until the watch thread has seen all four changes
        pending = backend.watch.undelivered()
        if any(isinstance(e, PodEvent) and e.pod.phase == Phase.SUCCEEDED for e in pending) and any(
                isinstance(e, NodeEvent) and e.node.ready for e in pending):
            break
        time.sleep(0.05)
    events = backend.poll(0)
    assert [(e.node.name, e.node.ready) for e in events if isinstance(e, NodeEvent)] == [("gpu-node-2", True)]
    assert [e.pod.phase for e in pod_events(events, "tessera-r42-1")] == [Phase.SUCCEEDED]


def test_a_malformed_watch_event_does_not_kill_the_watch(nodes, backend, pod_spec):
    backend.bind(pod_spec())
    collect(backend, lambda ev: pod_events(ev, "tessera-r42-1"))
    watches_open(nodes)
    nodes.garbage["Pod"] = 1
    nodes.end_watches()  # the next watch starts with the malformed event
    deadline = time.monotonic() + 15
    while nodes.garbage["Pod"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert nodes.garbage["Pod"] == 0, "the malformed event was never sent"
    nodes.set_pod_phase("tessera", "tessera-r42-1", "Running")
    collect(backend, lambda ev: Phase.RUNNING in phases(ev, "tessera-r42-1"))
