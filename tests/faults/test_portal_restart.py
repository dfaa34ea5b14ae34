"""The portal process is killed (-9) and started again on the same port while agents stream.
The agents reconnect and replay; within the stated time the portal holds every sample the agents
took meanwhile, with no hole in any sequence."""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime

import pytest

from portal.fleet.models import Node
from portal.fleet.services import issue_node_token
from portal.telemetry.models import GpuSample
from tests.waiting import wait_for

from .conftest import sample_holes, start_agent, start_portal

pytestmark = [pytest.mark.timeout(300)]
DOWN_S = 10
CATCH_UP_S = 60  # agents back off at most 2 s between attempts here; then the replay


def test_portal_killed_and_restarted_while_agents_stream(stage):
    portal, base = start_portal(stage)
    port = int(base.rsplit(":", 1)[1])
    nodes = list(Node.objects.order_by("name")[:3])
    for node in nodes:
        start_agent(stage, base, node.name, issue_node_token(node), interval=0.5)
    wait_for(lambda: all(GpuSample.objects.filter(gpu__node=n).exists() for n in nodes), 60, "every agent streams")

    portal.send_signal(signal.SIGKILL)
    portal.wait()
    killed_at = datetime.now(UTC)
    time.sleep(DOWN_S)
    start_portal(stage, port=port)
    back_at = datetime.now(UTC)
    started = time.monotonic()
    wait_for(lambda: all(GpuSample.objects.filter(gpu__node=n, ts__gt=back_at).exists() for n in nodes),
             CATCH_UP_S, "samples from every agent after the restart")
    took = time.monotonic() - started

    for node in nodes:
        assert sample_holes(node.name) == [], node.name
        during = GpuSample.objects.filter(gpu__node=node, ts__gt=killed_at, ts__lt=back_at).values("seq").distinct()
        assert during.count() >= (DOWN_S - 2) * 2, f"{node.name}: {during.count()} samples of the outage"
    print(f"portal down {DOWN_S} s; every agent caught up {took:.1f} s after it came back")
