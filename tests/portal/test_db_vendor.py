"""portal.db_vendor: each operation gives the same answer on PostgreSQL (here) and on SQLite (the
quickstart, in a subprocess): the newest row per key, time buckets, the sample rows a commit
writes and the streams it moves on, a lock for the transaction."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

pytestmark = pytest.mark.django_db

STREAM = uuid.UUID("3c66582e-e581-4e1d-aa74-80ea6746c195")


def answers() -> list[str]:
    """What the seam gives over the same rows, as text (run on either database)."""
    from django.db import connection, transaction
    from django.db.models import Sum

    from portal import db_vendor
    from portal.fleet.models import Gpu
    from portal.telemetry.models import AgentStream, GpuSample
    from portal.telemetry.sample_rows import SampleRows, StreamState, lock_streams, update_streams

    vendor = db_vendor.of(connection)
    gpus = list(Gpu.objects.order_by("pk")[:2])
    base = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
    with transaction.atomic():
        vendor.lock_for_transaction(connection, "test")
        stream = AgentStream.objects.create(node=gpus[0].node, stream=STREAM, agent_version="1", source="simulated",
                                            interval_ms=1000)
        locked = lock_streams([stream.pk])
        rows = SampleRows()
        for seq in range(1, 5):
            ts = base + timedelta(seconds=37 * seq)
            rows.add(stream.pk, seq, ts, [(g.pk, 10 * seq, None, 100 + seq, 0.1 + 0.2, None) for g in gpus], [])
        rows.write()
        locked[stream.pk] = StreamState(4, 2, base + timedelta(seconds=148), True)
        update_streams(locked)
    stream.refresh_from_db()
    newest = vendor.newest_per(GpuSample.objects.all(), ["gpu_id"], "ts", ["gpu_id", "ts", "seq", "power_w"])
    buckets = (GpuSample.objects.annotate(b=vendor.epoch_bucket("ts", 60)).values("b").annotate(n=Sum("seq"))
               .order_by("b").values_list("b", "n"))
    return [repr((stream.last_seq, stream.dropped, stream.last_sample_at)),
            repr(sorted((r["gpu_id"] - gpus[0].pk, r["ts"], r["seq"], r["power_w"]) for r in newest)),
            repr(list(buckets))]


def test_the_same_answers_on_postgresql_and_sqlite(fleet, on_sqlite):
    here = answers()
    assert here[0] == repr((4, 2, datetime(2026, 5, 1, 12, 2, 28, tzinfo=UTC)))
    assert "0.30000000000000004" in here[1]  # the same double through COPY text
    lines = on_sqlite("""
        from portal.fleet import inventory
        from tests.portal.test_db_vendor import answers
        inventory.load(os.environ["INVENTORY"])
        print("\\n".join(answers()))
    """)
    assert lines[-3:] == here


def test_a_vendor_the_portal_does_not_run_on_is_refused():
    from portal import db_vendor

    class Oracle:
        vendor = "oracle"

    with pytest.raises(NotImplementedError, match="PostgreSQL or SQLite, not oracle"):
        db_vendor.of(Oracle())


def authenticated() -> list[str]:
    """What token authentication reads back by its own SQL, as text (run on either database)."""
    from django.contrib.auth import get_user_model

    from portal.tenancy.authentication import HashedTokenAuthentication
    from portal.tenancy.services import create_token

    user = get_user_model().objects.create_user("dana", email="dana@example.org")
    token, secret = create_token(user, "laptop")
    found, by = HashedTokenAuthentication().authenticate_credentials(secret)
    return [repr((found.username, found.email, found.is_active, found.is_staff, found.date_joined == user.date_joined,
                  by.name, by.created_at == token.created_at, by.revoked_at))]


def test_token_authentication_reads_the_same_on_both(db, on_sqlite):
    """Booleans and datetimes come back converted as the ORM would (SQLite needs converters)."""
    here = authenticated()
    assert here == [repr(("dana", "dana@example.org", True, False, True, "laptop", True, None))]
    lines = on_sqlite("""
        from tests.portal.test_db_vendor import authenticated
        print("\\n".join(authenticated()))
    """)
    assert lines[-1:] == here
