"""The demo's departments and quotas per GPU model: made through the services, borrowing visible
(research holds more A100s than its teams are promised), and seeding again changes nothing."""

from decimal import Decimal

import pytest
from django.core.management import call_command

from portal.audit import services as audit
from portal.audit.models import AuditEntry
from portal.tenancy import departments, quotas
from portal.tenancy.models import Department, Quota, Team


@pytest.fixture
def demo(settings):
    settings.DEMO_MODE = True
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

    def seed():
        call_command("seed_demo", stdout=open("/dev/null", "w"))  # noqa: SIM115

    return seed


def tree() -> dict:
    return {**{f"department {d.slug}": d.parent.slug if d.parent_id else None
               for d in Department.objects.select_related("parent")},
            **{t.slug: t.department.slug for t in Team.objects.select_related("department")}}


@pytest.mark.django_db
def test_demo_teams_sit_under_departments_with_quotas_per_model(demo):
    demo()
    assert tree() == {"department research": None, "department perception": "research",
                      "department language": "research", "vision": "perception", "nlp": "language"}
    research = {r["gpu_model"]: r for r in quotas.quotas_of(Department.objects.get(slug="research"))}
    vision = {r["gpu_model"]: r for r in quotas.quotas_of(Team.objects.get(slug="vision"))}
    nlp = {r["gpu_model"]: r for r in quotas.quotas_of(Team.objects.get(slug="nlp"))}
    assert research["A100-80GB"]["gpu_share"] > vision["A100-80GB"]["gpu_share"] + nlp["A100-80GB"]["gpu_share"]
    assert vision["A100-80GB"]["borrowing_limit"]["gpu_share"] == Decimal("2.000")
    assert set(vision) == {"A100-80GB", "T4"} and set(nlp) == {"A100-80GB", "V100-32GB"}
    written = AuditEntry.objects.count()
    demo()
    assert AuditEntry.objects.count() == written  # nothing changed the second time


@pytest.mark.django_db
def test_demo_moves_teams_seeded_before_departments(demo):
    # As 0007 leaves a demo database seeded before: the teams under `default`, which holds their sum.
    by = audit.cli("test")
    default = departments.create_department(by, "default", "All teams")
    for slug in ("vision", "nlp"):
        team = Team.objects.create(slug=slug, name=slug, department=default)
        Quota.objects.create(team=team, gpu_model="*", gpu_share=3, gpu_memory_gib=160, gpus=6)
    Quota.objects.create(department=default, gpu_model="*", gpu_share=6, gpu_memory_gib=320, gpus=12)
    demo()
    assert tree()["vision"] == "perception" and tree()["nlp"] == "language"
    assert not Department.objects.filter(slug="default").exists()
    assert not Quota.objects.filter(team__slug="vision", gpu_model="*").exists()
