"""The move from one flat quota per team to quota rows keeps every team's numbers, forward and back
(tenancy 0006-0008), on the database as it was."""

from decimal import Decimal

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("tenancy", "0005_idle_warning")]
AFTER = [("tenancy", "0008_drop_team_quota_columns")]


@pytest.fixture
def executor(transactional_db):
    """Migrations run for real; the schema is put back to the latest whatever the test does."""
    executor = MigrationExecutor(connection)
    yield executor
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def migrate(executor: MigrationExecutor, target):
    executor.loader.build_graph()
    executor.migrate(target)
    return MigrationExecutor(connection).loader.project_state(target).apps


def test_team_quotas_move_to_any_model_rows_under_one_department_and_back(executor):
    apps = migrate(executor, BEFORE)
    Team = apps.get_model("tenancy", "Team")
    Team.objects.create(slug="vision", name="Vision", quota_gpu_share=Decimal("3.250"), quota_memory_mib=204_800,
                        quota_max_gpus=6)
    Team.objects.create(slug="nlp", name="NLP", quota_gpu_share=Decimal("0.125"), quota_memory_mib=200_000,
                        quota_max_gpus=1)

    apps = migrate(executor, AFTER)
    Quota, Department = apps.get_model("tenancy", "Quota"), apps.get_model("tenancy", "Department")
    default = Department.objects.get()
    assert (default.slug, default.name, default.parent_id) == ("default", "All teams", None)
    assert set(apps.get_model("tenancy", "Team").objects.values_list("slug", "department__slug")) == {
        ("vision", "default"), ("nlp", "default")}
    rows = {(q.team.slug if q.team_id else "department " + q.department.slug): q for q in Quota.objects.all()}
    assert set(rows) == {"vision", "nlp", "department default"}
    vision, nlp, total = rows["vision"], rows["nlp"], rows["department default"]
    assert (vision.gpu_model, vision.gpu_share, vision.gpu_memory_gib, vision.gpus) == \
        ("*", Decimal("3.250"), Decimal("200.000"), 6)
    # 200,000 MiB is no whole number of thousandths of a GiB: rounded half up (the migration says so).
    assert (nlp.gpu_share, nlp.gpu_memory_gib, nlp.gpus) == (Decimal("0.125"), Decimal("195.313"), 1)
    assert (total.gpu_model, total.gpu_share, total.gpu_memory_gib, total.gpus) == \
        ("*", Decimal("3.375"), Decimal("395.313"), 7)
    assert all(q.weight == 1 and q.borrow_gpu_share is None and q.lend_gpus is None for q in rows.values())

    # Changed under the new schema, then taken back: the `*` rows are what the columns become.
    Quota.objects.filter(pk=vision.pk).update(gpu_share=Decimal("4.500"), gpus=8)
    apps = migrate(executor, BEFORE)
    back = {t.slug: (t.quota_gpu_share, t.quota_memory_mib, t.quota_max_gpus)
            for t in apps.get_model("tenancy", "Team").objects.all()}
    assert back == {"vision": (Decimal("4.500"), 204_800, 8), "nlp": (Decimal("0.125"), 200_001, 1)}


def test_a_database_without_teams_gets_no_department(executor):
    migrate(executor, BEFORE)
    apps = migrate(executor, AFTER)
    assert not apps.get_model("tenancy", "Department").objects.exists()
    assert not apps.get_model("tenancy", "Quota").objects.exists()
