"""Housekeeping looks for ended pods every 5 s; it must read only the reservations that name a pod,
not every reservation ever made (the table only grows)."""

from __future__ import annotations

import pytest
from django.db import connection

from portal.placement.pods import ended_pods


@pytest.mark.django_db
def test_the_ended_pods_query_reads_only_rows_that_name_a_pod():
    if connection.vendor != "postgresql":
        pytest.skip("partial indexes are planned by PostgreSQL here")
    with connection.cursor() as cursor:  # the test's transaction: the planner may not pick a table scan
        cursor.execute("SET LOCAL enable_seqscan = off")
    plan = ended_pods().explain()
    assert "reservation_with_pod" in plan, plan
