from scheduler.core import Request, TeamUsage
from scheduler.core.queue import queue_order


def ids(reqs):
    return [r.id for r in reqs]


def test_priority_then_fair_share_then_age():
    teams = {"heavy": TeamUsage(quota_gpus=4, used_gpus=4), "light": TeamUsage(quota_gpus=4, used_gpus=1)}
    reqs = [
        Request("old-heavy", team="heavy", created_at=0),
        Request("new-light", team="light", created_at=50),
        Request("urgent", team="heavy", priority=10, created_at=60),
        Request("older-light", team="light", created_at=10),
    ]
    assert ids(queue_order(reqs, teams, now=60)) == ["urgent", "older-light", "new-light", "old-heavy"]


def test_aging_lifts_a_long_waiting_request():
    reqs = [Request("fresh", priority=2, created_at=1000), Request("waiting", priority=0, created_at=0)]
    assert ids(queue_order(reqs, {}, now=1000, aging_s=300)) == ["waiting", "fresh"]
    assert ids(queue_order(reqs, {}, now=1000, aging_s=600)) == ["fresh", "waiting"]
