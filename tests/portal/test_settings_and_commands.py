"""Settings profiles and the management commands people run by hand."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from portal.fleet.models import Gpu, Node
from portal.tenancy.models import Membership, Team

ROOT = Path(__file__).resolve().parents[2]


def run_manage(*args, **env):
    full = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
    full.update(env)
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=full, capture_output=True,
                          text=True, timeout=120)


def test_production_profile_passes_check_deploy(tmp_path):
    r = run_manage("check", "--deploy", "--fail-level", "WARNING", TESSERA_PROFILE="production",
                   SECRET_KEY="k" * 64 + "-Zq9!x", ALLOWED_HOSTS="tessera.example.com",
                   DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no issues" in r.stdout


def test_production_refuses_to_start_without_secret_key(tmp_path):
    r = run_manage("check", TESSERA_PROFILE="production", SECRET_KEY="",
                   DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    assert r.returncode != 0
    assert "SECRET_KEY must be set" in r.stderr


def test_bad_boolean_setting_is_named(tmp_path):
    r = run_manage("check", DEBUG="maybe", DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    assert r.returncode != 0 and "DEBUG must be a boolean" in r.stderr


@pytest.mark.django_db
def test_seed_demo_builds_fleet_and_people(settings):
    settings.DEMO_MODE = True
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    call_command("seed_demo")
    call_command("seed_demo")  # idempotent
    assert Node.objects.count() == 4 and Gpu.objects.count() == 18
    assert set(Gpu.objects.values_list("model", flat=True)) == {"A100-80GB", "V100-32GB", "T4"}
    assert set(Team.objects.values_list("slug", flat=True)) == {"vision", "nlp"}
    assert set(Membership.objects.filter(user__username="dave").values_list("role", flat=True)) == {"manager"}
    from portal.tenancy.models import Preset
    from portal.tenancy.policy import policy_of

    assert Preset.objects.filter(team__slug="vision").count() == 3
    assert policy_of(Team.objects.get(slug="vision")).max_priority("member") == 60
    from django.contrib.auth import authenticate

    assert authenticate(username="carol", password="tessera-demo") is not None


@pytest.mark.django_db
def test_seed_demo_refused_outside_demo_mode(settings):
    settings.DEMO_MODE = False
    with pytest.raises(CommandError, match="runs only with DEBUG or TESSERA_DEMO=1"):
        call_command("seed_demo")
    assert not Team.objects.exists()


@pytest.mark.django_db
def test_seed_demo_reports_bad_inventory(settings, tmp_path):
    settings.DEMO_MODE = True
    bad = tmp_path / "fleet.yaml"
    bad.write_text("nodes:\n  - name: n1\n    gpus: [{model: T4, memory_mib: lots}]\n")
    with pytest.raises(CommandError, match=r"fleet.yaml: nodes\[0\].gpus\[0\].memory_mib"):
        call_command("seed_demo", inventory=str(bad))
    assert not Node.objects.exists()


@pytest.mark.django_db
def test_node_token_is_shown_once_and_stored_hashed(capsys):
    from portal.fleet.services import node_for_token

    call_command("node_token", "gpu-7", create=True)
    key = capsys.readouterr().out.strip()
    node = Node.objects.get(name="gpu-7")
    assert key not in node.agent_token_hash and node_for_token(key) == node
    call_command("node_token", "gpu-7")  # rotate: the old key stops working
    assert node_for_token(key) is None
    with pytest.raises(CommandError, match="no node named 'ghost'"):
        call_command("node_token", "ghost")


def test_openapi_schema_is_valid_without_warnings(tmp_path):
    r = run_manage("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"),
                   DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    assert r.returncode == 0, r.stderr
    assert "/api/v1/reservations/" in (tmp_path / "schema.yaml").read_text()


def test_the_websocket_limit_defaults_to_the_largest_agent_message():
    from wire.agent_portal import MAX_MESSAGE_BYTES

    env = {k: v for k, v in os.environ.items() if k != "TESSERA_WS_MAX_MESSAGE_BYTES"}
    out = subprocess.run([sys.executable, "-c", "from django.conf import settings; "
                          "print(settings.TESSERA_WS_MAX_MESSAGE_BYTES)"],
                         cwd=ROOT, env={**env, "DJANGO_SETTINGS_MODULE": "portal.settings"}, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == str(MAX_MESSAGE_BYTES), out.stderr
