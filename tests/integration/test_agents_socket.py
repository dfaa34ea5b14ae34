"""ws/agents/ against a real Daphne: token auth, malformed, oversized and flooding messages, and a
portal restart under a running agent that leaves no hole in the stored series."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from portal.fleet.services import issue_node_token, revoke_node_token
from portal.telemetry.models import AgentStream, GpuSample, ShareSample
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(120)


def _hello(world, stream: str) -> str:
    gpus = [{"index": g.index, "uuid": g.uuid, "model": g.model, "memory_mib": g.memory_mib,
             "numa_node": g.numa_node, "nvlink_peers": [], "mig_mode": "disabled"}
            for g in world["gpus"].values()]
    return json.dumps({"v": 1, "type": "hello", "node": world["node"].name, "stream": stream,
                       "agent_version": "0.1.0", "source": "simulated", "driver_version": "simulated",
                       "interval_ms": 1000, "gpus": gpus})


def _samples(world, stream: str, first: int, count: int = 1) -> str:
    now = int(time.time() * 1000)
    samples = [{"seq": first + i, "ts_ms": now - (count - i) * 1000, "processes": [], "shares": [],
                "gpus": [{"uuid": g.uuid, "sm_util_pct": 10, "mem_util_pct": 5, "mem_used_mib": 100,
                          "power_w": 50.0, "temp_c": 40} for g in world["gpus"].values()]}
               for i in range(count)]
    return json.dumps({"v": 1, "type": "samples", "stream": stream, "dropped": 0, "samples": samples})


def _agent_socket(portal, token: str | None):
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return connect(f"{portal.ws}/ws/agents/", additional_headers=headers, open_timeout=10)


def _until(ws, kind: str) -> dict:
    while True:
        message = json.loads(ws.recv(timeout=10))
        if message["type"] == kind:
            return message


def test_missing_wrong_and_revoked_tokens_are_refused_at_the_handshake(portal, world):
    node = world["node"]
    token = issue_node_token(node)
    for bad in (None, "not-a-token", token + "x", "tnode_ with space"):
        with pytest.raises(InvalidStatus) as refused:
            _agent_socket(portal, bad)
        assert refused.value.response.status_code == 403
    with _agent_socket(portal, token) as ws:  # the good one is let in
        ws.send(_hello(world, str(uuid.uuid4())))
        assert _until(ws, "welcome")["acked_seq"] == 0
        _until(ws, "placements")
        revoke_node_token(node)  # while connected: the connection goes too
        with pytest.raises(ConnectionClosed) as closed:
            _until(ws, "never")
        assert closed.value.rcvd.code == 4008
    with pytest.raises(InvalidStatus):
        _agent_socket(portal, token)


@pytest.mark.parametrize("retire", ["rotate", "revoke"])
def test_a_connection_that_has_not_said_hello_is_closed_when_its_token_is_retired(portal, world, retire):
    """The connection is tied to its token from the handshake: one that never sends its hello is
    closed by a rotation or revocation too, and the hello it sends afterwards is not answered."""
    node = world["node"]
    token = issue_node_token(node)
    with _agent_socket(portal, token) as ws:
        new_token = issue_node_token(node) if retire == "rotate" else revoke_node_token(node)
        error = _until(ws, "error")
        assert (error["code"], error["fatal"]) == ("node_mismatch", True)
        with pytest.raises(ConnectionClosed) as closed:
            ws.send(_hello(world, str(uuid.uuid4())))
            _until(ws, "welcome")
        assert closed.value.rcvd.code == 4008
    if new_token:  # the rotated-in token is let in and answered
        with _agent_socket(portal, new_token) as ws:
            ws.send(_hello(world, str(uuid.uuid4())))
            assert _until(ws, "welcome")["node"] == node.name


def test_hello_for_another_node_is_refused(portal, world):
    token = issue_node_token(world["node"])
    with _agent_socket(portal, token) as ws:
        ws.send(_hello(world, str(uuid.uuid4())).replace('"a100-node-1"', '"a100-node-2"'))
        error = _until(ws, "error")
        assert (error["code"], error["fatal"]) == ("node_mismatch", True)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
        assert closed.value.rcvd.code == 4008


def test_a_bad_message_is_refused_and_the_connection_survives(portal, world):
    token = issue_node_token(world["node"])
    stream = str(uuid.uuid4())
    with _agent_socket(portal, token) as ws:
        ws.send(_hello(world, stream))
        _until(ws, "welcome")
        ws.send("this is not json")
        assert _until(ws, "error")["code"] == "bad_json"
        bad = json.loads(_samples(world, stream, 1))
        bad["samples"][0]["gpus"][0]["sm_util_pct"] = 101
        ws.send(json.dumps(bad))
        error = _until(ws, "error")
        assert (error["code"], error["fatal"], error["ref_seq"]) == ("invalid_message", False, 1)
        assert "sm_util_pct" in error["message"]
        ws.send(_samples(world, stream, 1, count=3))
        assert _until(ws, "ack")["seq"] == 3
    assert AgentStream.objects.get(stream=stream).last_seq == 3
    assert GpuSample.objects.filter(stream__stream=stream).count() == 3 * len(world["gpus"])


def test_an_oversized_frame_closes_the_connection(portal, world):
    token = issue_node_token(world["node"])
    with _agent_socket(portal, token) as ws:
        ws.send(_hello(world, str(uuid.uuid4())))
        _until(ws, "welcome")
        ws.send('{"v":1,"type":"samples","pad":"' + "x" * (1_048_576 + 10) + '"}')
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                message = json.loads(ws.recv(timeout=10))
                if message["type"] == "error":
                    assert (message["code"], message["fatal"]) == ("too_large", True)
        # Daphne as deployed (portal.serve) refuses the frame at its header: 1009 when the agent
        # reads the close before the reset, none (1006) when it was still writing.
        assert closed.value.rcvd is None or closed.value.rcvd.code in (1009, 4009)


def test_a_flood_closes_the_connection(portal, world):
    """Past the message rate the portal answers rate_limited (fatal) and closes with 4008; the
    nonsense before that was answered one message at a time without closing.

    The flood is sent from a thread while this one reads, as an agent's socket does. Sending all
    of it before reading made what the client saw depend on timing: the unread answers filled the
    client's queue, so it stopped reading and did not answer the portal's close; on a busy machine
    the portal's closing handshake timed out and it dropped the connection, and the next send
    failed with no close frame and no error read (codes empty, no close code)."""
    token = issue_node_token(world["node"])
    with _agent_socket(portal, token) as ws:
        ws.send(_hello(world, str(uuid.uuid4())))
        _until(ws, "welcome")

        def flood() -> None:
            with contextlib.suppress(ConnectionClosed):  # the portal closes while we still send
                for _ in range(500):
                    ws.send('{"v": 1, "type": "nonsense"}')

        sender = threading.Thread(target=flood, daemon=True)
        sender.start()
        codes = []
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                message = json.loads(ws.recv(timeout=10))
                if message["type"] == "error":
                    codes.append((message["code"], message["fatal"]))
        sender.join(10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4008
    # Answered one by one until the bucket ran out, then the one fatal answer, then nothing.
    assert codes[-1] == ("rate_limited", True)
    assert codes[:-1] and set(codes[:-1]) == {("invalid_message", False)}


def test_portal_restart_leaves_no_hole_in_the_stored_series(portal, agents, world):
    node = world["node"]
    agents.start(node.name, issue_node_token(node), interval=0.2)
    stream = wait_for(lambda: AgentStream.objects.filter(node=node, last_seq__gte=10).first(), 30,
                      "the agent's first samples")
    portal.stop()
    time.sleep(3)  # the agent keeps sampling into its buffer (~15 samples)
    down_at = AgentStream.objects.get(pk=stream.pk).last_seq
    portal.start()
    wait_for(lambda: AgentStream.objects.get(pk=stream.pk).last_seq >= down_at + 30, 40,
             "the replay and fresh samples after the restart")
    rows = GpuSample.objects.filter(stream=stream)
    seqs = sorted(set(rows.values_list("seq", flat=True)))
    last = seqs[-1]
    assert seqs == list(range(1, last + 1)), "a sample is missing from the stored series"
    assert rows.count() == last * len(world["gpus"])  # no duplicates either
    assert "refused" not in agents.log(node.name)
    # The simulated agent follows the placements pushed at welcome: both shares are reported.
    reported = set(ShareSample.objects.values_list("reservation_id", flat=True))
    assert reported == {r.pk for r in world["reservations"].values()}


def test_a_remote_share_that_ends_is_revoked_on_its_gpu_nodes_agent(portal, world):
    """Cancelling a remote reservation reaches, after its commit, the agent of the node whose GPU it
    held (wire/PROTOCOL.md 5.5): the agent writes it to the remote server's --revoked-file."""
    from portal.reservations import services
    from portal.reservations.models import Reservation, Sharing

    vision = world["reservations"]["vision"]
    Reservation.objects.filter(pk=vision.pk).update(sharing=Sharing.REMOTE)
    hello = json.loads(_hello(world, str(uuid.uuid4())))
    with _agent_socket(portal, issue_node_token(world["node"])) as ws:
        ws.send(json.dumps({**hello, "revocations": True}))
        assert _until(ws, "revoked_shares")["shares"] == []
        before = int(time.time())
        services.cancel(vision.pk, world["people"]["alice"], "not needed")
        revoked = _until(ws, "revoked_shares")["shares"]
    assert [s["share"] for s in revoked] == [str(vision.pk)]
    assert before <= revoked[0]["at"] <= time.time()  # when it gave the GPU back
