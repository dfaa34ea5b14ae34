"""An API server restart fails no reservation: while it is down the backend waits for its /readyz and
goes on as soon as it answers, and the RBAC 403 a restarted server answers until its authorizer's
cache has synced is asked again, not taken for a missing Role. A Role that is really missing still
fails at once after that second look, saying what to apply."""

from __future__ import annotations

import time

import pytest

from scheduler.backends import PermanentBackendError

# attempts and backoff as deployed would make these tests wait; what matters is that the wait for the
# server is not a backoff, and that an RBAC refusal is looked at again after the authorizer's sync.
RESTART = dict(attempts=4, base_s=0.01, max_s=0.05, connect_timeout_s=1.0, read_timeout_s=1.0,
               probe_s=0.05, outage_s=10.0, recheck_s=1.0)


@pytest.fixture
def restartable(apiserver):
    if not hasattr(apiserver, "restart"):
        pytest.skip("restarts the fake API server")
    return apiserver


def test_a_reservation_bound_during_a_restart_is_bound_once_the_server_is_back(restartable, nodes, make_backend,
                                                                                pod_spec):
    backend = make_backend(retry=RESTART)
    restart = restartable.restart(down_s=0.5, authorizing_s=0.5)
    try:
        status = backend.bind(pod_spec())
    finally:
        restart.join()
    assert [p["metadata"]["name"] for p in restartable.pods()] == [status.name]


def test_after_an_outage_binding_resumes_when_the_server_answers_not_after_the_backoff(restartable, nodes,
                                                                                       make_backend, pod_spec):
    backend = make_backend(retry={**RESTART, "base_s": 30.0, "max_s": 30.0})  # a backoff as long as Celery's cap
    waits = []

    def sleep(seconds):
        waits.append(seconds)
        time.sleep(seconds)

    backend.api.sleep = sleep
    restart = restartable.restart(down_s=0.5, authorizing_s=0.0)
    try:
        backend.bind(pod_spec())
    finally:
        restart.join()
    assert waits and set(waits) == {RESTART["probe_s"]}  # it only probed the server, never slept a backoff


def test_an_rbac_refusal_that_outlasts_the_restart_is_final_and_says_what_to_apply(restartable, nodes,
                                                                                    make_backend, pod_spec):
    backend = make_backend(retry=RESTART)
    restartable.go_down()
    restartable.come_back(authorizing_s=3600)  # the Role is not there: refused for good
    with pytest.raises(PermanentBackendError, match="may not get nodes cluster-wide: apply deploy"):
        backend.bind(pod_spec())
    assert len(restartable.calls("GET", r"^/api/v1/nodes/gpu-node-1$")) == 2  # asked again once
    assert restartable.pods() == []
