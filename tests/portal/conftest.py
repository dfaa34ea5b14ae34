"""Personas and a demo fleet for the portal tests.

alice: vision member · bob: nlp member · carol: vision team admin · dave: vision manager ·
erin: nlp team admin · admin: staff.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client
from rest_framework.test import APIClient

from portal.fleet import inventory
from portal.fleet.models import Gpu
from portal.placement import queue
from portal.tenancy.models import ExclusionGroup, Membership, Quota, Role, Team, mib_to_gib

ROOT = Path(__file__).resolve().parents[2]
DEMO_INVENTORY = ROOT / "deploy" / "inventory" / "demo.yaml"


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    # The real hasher costs ~0.5 s per user; the personas need none of its strength.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _fresh_learnt_forecast():
    # what the forecast learnt from ended reservations is kept per process for minutes: one test's
    # reservations must not teach the next test's estimates
    queue.forget_learnt()
    yield
    queue.forget_learnt()


@pytest.fixture(autouse=True)
def _fresh_preview_snapshot():
    # the request preview keeps the fleet snapshot for two seconds per process: the test before
    # (another fleet, other reservations) must not answer this one's preview
    from portal.web import preview

    preview.forget_snapshot()
    yield
    preview.forget_snapshot()


@pytest.fixture(autouse=True)
def _fresh_throttle_cache():
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def fleet(db):
    inventory.load(DEMO_INVENTORY)
    return Gpu.objects.select_related("node")


@pytest.fixture
def teams(db):
    """vision and nlp, directly under the organisation, each with a `*` quota (any GPU model)."""
    vision = Team.objects.create(slug="vision", name="Vision", allow_over_quota=True)
    nlp = Team.objects.create(slug="nlp", name="NLP", allow_over_quota=False)
    # 200,000 MiB and 100,000 MiB of GPU memory, as the flat quotas of before were.
    Quota.objects.create(team=vision, gpu_model="*", gpu_share=Decimal("2.0"), gpu_memory_gib=mib_to_gib(200_000),
                         gpus=4)
    Quota.objects.create(team=nlp, gpu_model="*", gpu_share=Decimal("1.5"), gpu_memory_gib=mib_to_gib(100_000), gpus=3)
    ExclusionGroup.objects.create(team=vision, label="secure")
    return {"vision": vision, "nlp": nlp}


def _person(username, memberships=(), staff=False):
    user = get_user_model().objects.create_user(username, password="pw-" + username, is_staff=staff)
    for team, role in memberships:
        Membership.objects.create(user=user, team=team, role=role)
    return user


@pytest.fixture
def people(teams):
    v, n = teams["vision"], teams["nlp"]
    return {
        "alice": _person("alice", [(v, Role.MEMBER)]),
        "alice2": _person("alice2", [(v, Role.MEMBER)]),
        "bob": _person("bob", [(n, Role.MEMBER)]),
        "carol": _person("carol", [(v, Role.ADMIN)]),
        "dave": _person("dave", [(v, Role.MANAGER)]),
        "erin": _person("erin", [(n, Role.ADMIN)]),
        "admin": _person("admin", staff=True),
    }


@pytest.fixture
def client_for(people):
    def make(name: str) -> APIClient:
        client = APIClient()
        client.force_authenticate(people[name])
        return client

    return make


@pytest.fixture
def browser_for(people):
    """name → a Django test client signed in as that person (the pages, with their session)."""
    def make(name: str) -> Client:
        client = Client()
        client.force_login(people[name])
        return client

    return make


@pytest.fixture
def reservation_body():
    def make(**overrides) -> dict:
        body = {"team": "vision", "image": "pytorch/pytorch:2.3.0", "command": ["python", "train.py"],
                "gpu_request": 0.25, "gpu_memory_mib": 8192}
        body.update(overrides)
        return body

    return make


@pytest.fixture
def on_sqlite(tmp_path):
    """`run(script)`: the script's printed lines, run in a fresh process on a migrated SQLite
    database (what the quickstart uses), Django set up; fails the test if the script fails."""

    def run(script: str) -> list[str]:
        prologue = "import os\nimport django\ndjango.setup()\nfrom django.core.management import call_command\n" \
                   "call_command('migrate', verbosity=0)\n"
        env = dict(os.environ, DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
                   DJANGO_SETTINGS_MODULE="portal.settings", INVENTORY=str(DEMO_INVENTORY), PYTHONPATH=str(ROOT))
        out = subprocess.run([sys.executable, "-c", prologue + textwrap.dedent(script)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout.strip().splitlines()

    return run
