"""Agents hear about allocation changes after commit, once per node per commit."""

import pytest
from django.db import transaction

from portal.reservations import events
from portal.reservations.events import allocations_changed, announce_allocations


@pytest.fixture
def heard():
    # Earlier tests' transactions are rolled back without running on_commit, which leaves their
    # node ids noted in this thread; start clean.
    events.forget_pending()
    got: list[int] = []

    def listener(sender, node_ids, **kwargs):
        got.extend(node_ids)

    allocations_changed.connect(listener, dispatch_uid="test-events")
    yield got
    allocations_changed.disconnect(dispatch_uid="test-events")


@pytest.mark.django_db(transaction=True)
def test_one_push_per_node_per_commit(heard):
    with transaction.atomic():
        for node in (3, 1, 3, 3, 1, 2):
            announce_allocations(node)
        assert heard == []  # nothing before commit
    assert heard == [1, 2, 3]  # one signal for the commit, every node once, in order


@pytest.mark.django_db(transaction=True)
def test_rolled_back_changes_are_not_announced(heard):
    with pytest.raises(RuntimeError), transaction.atomic():
        announce_allocations(7)
        raise RuntimeError("abort")
    with transaction.atomic():
        announce_allocations(8)
    # 7's change never committed; its id may ride along with the next flush, which is harmless
    # because a push carries the node's full list — but 8 must be announced exactly once.
    assert heard.count(8) == 1


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_it_is_sent_at_once(heard):
    announce_allocations(None)
    announce_allocations(5)
    assert heard == [5]


@pytest.mark.django_db(transaction=True)
def test_held_announcements_go_out_once_when_the_block_ends(heard):
    with events.announcements_held():
        for batch in ((1, 2), (2, 3)):
            with transaction.atomic():
                for node in batch:
                    announce_allocations(node)
            assert heard == []  # committed, but held
        with events.announcements_held():  # nested: the outer block sends
            announce_allocations(4)
        assert heard == []
    assert heard == [1, 2, 3, 4]


@pytest.mark.django_db(transaction=True)
def test_held_announcements_are_sent_even_when_the_block_fails(heard):
    with pytest.raises(RuntimeError), events.announcements_held():
        with transaction.atomic():
            announce_allocations(5)
        raise RuntimeError("cycle fenced out")
    assert heard == [5]
    announce_allocations(6)  # and holding is over
    assert heard == [5, 6]
