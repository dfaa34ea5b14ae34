"""The token policy on a virtual clock: shares, limits, work conservation, priority, adaptation."""

from __future__ import annotations

import pytest

from agents.broker.policy import BrokerSettings, GpuScheduler

SETTINGS = BrokerSettings()


def join(sched: GpuScheduler, cid: int, share: str, request: float, limit: float, high: bool, pid: int,
         now: float) -> None:
    """A process joins a share, which the node's agent defines first if it is new (terms come only from it)."""
    if share not in sched.shares:
        sched.define_share(share, request, limit, high, now)
    sched.add_client(cid, share, pid, now)


class Sim:
    """Clients that always want the GPU (unless given a duty cycle) and use all of every quantum."""

    def __init__(self, settings: BrokerSettings = SETTINGS, handoff_s: float = 0.0) -> None:
        self.sched = GpuScheduler("gpu0", settings)
        self.handoff_s = handoff_s  # the GPU idles this long at every grant (report, decision, wake-up)
        self.now = 0.0
        self.grants = 0
        self.busy: dict[str, float] = {}
        self.wants: dict[int, object] = {}
        self.max_wait: dict[str, float] = {}
        self.max_quota: dict[str, float] = {}

    def add(self, cid: int, share: str, request: float, limit: float, high: bool = False, wants=None) -> None:
        join(self.sched, cid, share, request, limit, high, 1000 + cid, self.now)
        self.busy.setdefault(share, 0.0)
        self.wants[cid] = wants or (lambda t: True)
        self.sched.acquire(cid, 0.0, False, self.now)

    def run(self, seconds: float, step: float = 0.0005) -> None:
        end = self.now + seconds
        while self.now < end:
            for cid, wants in self.wants.items():
                client = self.sched.clients[cid]
                if not client.holding and client.waiting_since is None and wants(self.now):
                    self.sched.acquire(cid, 0.0, False, self.now)
            since = {cid: c.waiting_since for cid, c in self.sched.clients.items()}
            grant, wake = self.sched.schedule(self.now)
            if grant is None:
                self.now = min(end, max(self.now + step, wake or 0.0))
                continue
            client = self.sched.clients[grant.client_id]
            name = client.share.share_id
            self.max_wait[name] = max(self.max_wait.get(name, 0.0), self.now - since[grant.client_id])
            self.max_quota[name] = max(self.max_quota.get(name, 0.0), grant.quota_s)
            self.grants += 1
            self.now += self.handoff_s + grant.quota_s
            self.busy[client.share.share_id] += grant.quota_s
            if self.wants[grant.client_id](self.now):
                self.sched.acquire(grant.client_id, grant.quota_s, False, self.now)
            else:
                self.sched.release(grant.client_id, grant.quota_s, True, self.now)

    def fraction(self, share: str, seconds: float) -> float:
        return self.busy[share] / seconds


@pytest.mark.parametrize(("a", "b"), [(0.3, 0.7), (0.1, 0.9)])
def test_two_shares_at_their_limits_get_their_fractions(a: float, b: float) -> None:
    sim = Sim()
    sim.add(1, "a", a, a)
    sim.add(2, "b", b, b)
    sim.run(60)
    assert sim.fraction("a", 60) == pytest.approx(a, abs=0.01)
    assert sim.fraction("b", 60) == pytest.approx(b, abs=0.01)


def test_spare_time_is_split_by_request_when_both_may_burst() -> None:
    sim = Sim()
    sim.add(1, "a", 0.3, 1.0)
    sim.add(2, "b", 0.6, 1.0)
    sim.run(60)
    assert sim.fraction("a", 60) == pytest.approx(1 / 3, abs=0.01)
    assert sim.fraction("b", 60) == pytest.approx(2 / 3, abs=0.01)


def test_a_lone_share_bursts_to_its_limit() -> None:
    sim = Sim()
    sim.add(1, "a", 0.3, 1.0)
    sim.run(30)
    assert sim.fraction("a", 30) > 0.99


def test_limit_holds_in_every_window_even_alone() -> None:
    sim = Sim()
    sim.add(1, "a", 0.5, 0.5)
    for second in range(1, 31):
        sim.run(1)
        window = min(second, SETTINGS.window_s)
        used = sim.sched.shares["a"].window_used(sim.now, SETTINGS.window_s)
        assert used <= 0.5 * window + SETTINGS.max_quota_s
    assert sim.fraction("a", 30) == pytest.approx(0.5, abs=0.01)


def test_three_tenants_converge() -> None:
    sim = Sim()
    sim.add(1, "a", 0.2, 0.4)
    sim.add(2, "b", 0.3, 0.3)
    sim.add(3, "c", 0.1, 1.0)
    sim.run(60)
    assert sim.fraction("a", 60) == pytest.approx(0.4, abs=0.01)
    assert sim.fraction("b", 60) == pytest.approx(0.3, abs=0.01)
    assert sim.fraction("c", 60) == pytest.approx(0.3, abs=0.01)


def test_shares_at_their_limits_wait_for_whole_quanta_while_another_can_run() -> None:
    # Every grant costs a hand-off of idle GPU. Shares held at their limit must not take the GPU in
    # slivers of their trickling budget, or the hand-offs eat the time of the share that takes the rest.
    sim = Sim(handoff_s=0.0005)
    sim.add(1, "a", 0.2, 0.4)
    sim.add(2, "b", 0.3, 0.3)
    sim.add(3, "c", 0.1, 1.0)
    sim.run(60)
    assert sim.grants < 60 * 30  # ~20 quanta of 50 ms a second, not hundreds of slivers
    assert sim.fraction("a", 60) == pytest.approx(0.4, abs=0.01)
    assert sim.fraction("b", 60) == pytest.approx(0.3, abs=0.01)
    assert 0.29 <= sim.fraction("c", 60) <= 0.31  # the rest, less at most a point of hand-offs


def test_a_share_near_its_limit_still_gets_an_otherwise_idle_gpu() -> None:
    # waiting for a whole quantum is only for when someone else can use the GPU meanwhile
    sched = GpuScheduler("gpu0", SETTINGS)
    join(sched, 1, "a", 0.5, 0.5, False, 1, 0.0)
    now, used = 0.0, 0.0
    while True:
        sched.acquire(1, used, False, now)
        budget = sched.shares["a"].budget(now, SETTINGS)
        grant, _ = sched.schedule(now)
        assert grant is not None
        if budget < sched.shares["a"].quota_s:
            break
        now += grant.quota_s
        used = grant.quota_s
    assert budget >= SETTINGS.min_quota_s
    assert grant.quota_s == pytest.approx(budget)


def test_processes_of_one_share_count_together() -> None:
    sim = Sim()
    sim.add(1, "a", 0.5, 0.5)
    sim.add(2, "a", 0.5, 0.5)
    sim.add(3, "b", 0.5, 1.0)
    sim.run(30)
    assert sim.fraction("a", 30) == pytest.approx(0.5, abs=0.01)


def test_high_priority_goes_first_and_low_quanta_stay_short() -> None:
    sim = Sim()
    sim.add(1, "low", 0.5, 1.0)
    sim.add(2, "high", 0.1, 1.0, high=True, wants=lambda t: (t % 0.2) < 0.1)
    sim.run(20)
    assert sim.max_quota["low"] <= SETTINGS.low_quota_s  # low-priority quanta stay short ...
    assert sim.max_wait["high"] <= SETTINGS.low_quota_s + 0.001  # ... so a burst waits one at most
    assert sim.max_quota["high"] == SETTINGS.max_quota_s
    assert sim.fraction("high", 20) > 0.49  # all it asked for (half the time)
    assert sim.fraction("low", 20) > 0.45  # and the gaps went to the other


def test_quota_adapts_to_bursts_within_bounds() -> None:
    sched = GpuScheduler("gpu0", SETTINGS)
    join(sched, 1, "a", 0.5, 1.0, False, 1, 0.0)
    now = 0.0
    for _ in range(20):  # short bursts: the process goes idle after 3 ms
        sched.acquire(1, 0.0, False, now)
        grant, _ = sched.schedule(now)
        now += 0.003
        sched.release(1, 0.003, True, now)
    assert sched.shares["a"].quota_s == pytest.approx(0.006, abs=0.001)
    for _ in range(20):  # long bursts: it uses every quantum to the end
        sched.acquire(1, 0.0, False, now)
        grant, _ = sched.schedule(now)
        now += grant.quota_s
        sched.acquire(1, grant.quota_s, False, now)
        sched.release(1, 0.0, False, now)
    assert sched.shares["a"].quota_s == SETTINGS.max_quota_s


def test_a_silent_holder_loses_the_token_at_quantum_end() -> None:
    sched = GpuScheduler("gpu0", SETTINGS)
    join(sched, 1, "a", 0.5, 1.0, False, 1, 0.0)
    join(sched, 2, "b", 0.5, 1.0, False, 2, 0.0)
    sched.acquire(1, 0.0, False, 0.0)
    grant, deadline = sched.schedule(0.0)
    assert grant.client_id == 1
    sched.acquire(2, 0.0, False, 0.001)
    assert sched.schedule(0.001)[0] is None  # the holder still holds
    assert deadline <= grant.quota_s * 1.5 + SETTINGS.grace_s + 1e-9
    assert sched.expire_holder(deadline).client_id == 1
    grant2, _ = sched.schedule(deadline)
    assert grant2.client_id == 2
    assert sched.shares["a"].used_total_s == pytest.approx(grant.quota_s)  # charged its quantum


def test_a_draining_holder_keeps_the_token_until_its_queued_work_is_done() -> None:
    # its quantum is over but the GPU still runs what it queued: granting b now would only interleave
    # the two on the GPU; a holder hung in its drain still loses the token, at the drain allowance
    sched = GpuScheduler("gpu0", SETTINGS)
    join(sched, 1, "a", 0.5, 1.0, False, 1, 0.0)
    join(sched, 2, "b", 0.5, 1.0, False, 2, 0.0)
    sched.acquire(1, 0.0, False, 0.0)
    grant, deadline = sched.schedule(0.0)
    sched.acquire(2, 0.0, False, 0.001)
    sched.draining(1, grant.quota_s)
    assert sched.expire_holder(deadline) is None
    assert sched.schedule(deadline)[0] is None
    sched.acquire(1, grant.quota_s + 0.08, False, grant.quota_s + 0.08)  # its report, 80 ms of drain later
    assert sched.schedule(grant.quota_s + 0.08)[0].client_id == 2
    assert sched.shares["a"].used_total_s == pytest.approx(grant.quota_s + 0.08)  # the drain is charged
    grant, _ = sched.schedule(1.0)
    sched.draining(2, 1.0)
    assert sched.expire_holder(1.0 + SETTINGS.drain_max_s - 0.001) is None
    assert sched.expire_holder(1.0 + SETTINGS.drain_max_s).client_id == 2


def test_a_drain_notice_from_a_process_not_holding_changes_nothing() -> None:
    sched = GpuScheduler("gpu0", SETTINGS)
    join(sched, 1, "a", 0.5, 1.0, False, 1, 0.0)
    sched.draining(1, 0.0)
    sched.acquire(1, 0.0, False, 0.0)
    grant, deadline = sched.schedule(0.0)
    assert deadline == pytest.approx(grant.quota_s * 1.5 + SETTINGS.grace_s)


def test_a_holder_that_disconnects_frees_the_token_at_once() -> None:
    sched = GpuScheduler("gpu0", SETTINGS)
    join(sched, 1, "a", 0.5, 1.0, False, 1, 0.0)
    join(sched, 2, "b", 0.5, 1.0, False, 2, 0.0)
    sched.acquire(1, 0.0, False, 0.0)
    sched.acquire(2, 0.0, False, 0.0)
    assert sched.schedule(0.0)[0].client_id == 1
    sched.remove_client(1, 0.005)
    assert sched.schedule(0.005)[0].client_id == 2
    assert sched.shares["a"].used_total_s == pytest.approx(0.005)


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="quotas"):
        BrokerSettings(min_quota_s=0.01, initial_quota_s=0.005)
    with pytest.raises(ValueError, match="window"):
        BrokerSettings(window_s=0.1)


def test_a_share_has_only_the_terms_the_node_defined() -> None:
    sim = Sim()
    sim.sched.define_share("a", 0.2, 0.2, False, 0.0)
    sim.add(1, "a", 1.0, 1.0)  # whatever a process would claim, the share's terms are the node's
    sim.run(30)
    assert sim.fraction("a", 30) == pytest.approx(0.2, abs=0.01)


def test_a_process_cannot_join_a_share_the_node_did_not_define() -> None:
    with pytest.raises(KeyError):
        GpuScheduler("g", SETTINGS).add_client(1, "a", 1, 0.0)


def test_a_forgotten_share_loses_its_processes_and_the_token() -> None:
    sim = Sim()
    sim.add(1, "a", 0.5, 1.0)
    sim.add(2, "b", 0.5, 1.0)
    grant, _ = sim.sched.schedule(0.0)
    assert grant is not None
    holder_share = sim.sched.clients[grant.client_id].share.share_id
    assert sim.sched.forget_share(holder_share, 0.001) == [grant.client_id]
    assert holder_share not in sim.sched.shares and sim.sched.holder is None
    other, _ = sim.sched.schedule(0.001)
    assert other is not None and other.client_id != grant.client_id  # the token went on at once


def test_defined_terms_are_validated() -> None:
    with pytest.raises(ValueError, match="request <= limit"):
        GpuScheduler("g", SETTINGS).define_share("a", 0.5, 0.4, False, 0.0)
