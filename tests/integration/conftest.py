"""A real portal for integration tests: Daphne in a subprocess on the test database, with
channels-redis on the machine's Redis (its own DB number), plus helpers to run real agents and
to act as a signed-in browser."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.test import Client

from tests.teams import make_team

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "deploy" / "inventory" / "demo.yaml"
# This suite's own Redis database, flushed before and after; TESSERA_TEST_REDIS_DB moves it so that two
# checkouts on one machine can run their browser and integration tests side by side.
REDIS_DB = int(os.environ.get("TESSERA_TEST_REDIS_DB", "7"))
REDIS_URL = f"redis://127.0.0.1:6379/{REDIS_DB}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port} after {timeout} s")


def _database_url() -> str:
    db = django_settings.DATABASES["default"]
    if db["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("integration tests need PostgreSQL (DATABASE_URL)")
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{user}{password}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


class Portal:
    """Daphne as deployed (portal.serve) serving portal.asgi on a free port; restartable on the same port."""

    def __init__(self, tmp: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws = f"ws://127.0.0.1:{self.port}"
        self.log = tmp / "daphne.log"
        self.env = {**os.environ, "DATABASE_URL": _database_url(), "REDIS_URL": REDIS_URL,
                    "DJANGO_SETTINGS_MODULE": "portal.settings", "TESSERA_TELEMETRY_TICKER": "0",
                    "CELERY_TASK_ALWAYS_EAGER": "1", "LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1",
                    # Notification mails stay in the process (no SMTP server here, nothing into var/mail/).
                    "EMAIL_BACKEND": "django.core.mail.backends.locmem.EmailBackend"}
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "portal.serve", "-b", "127.0.0.1", "-p", str(self.port), "portal.asgi:application"],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        _wait_port(self.port)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@pytest.fixture
def redis_layer(settings, redis_channel_layer):
    """This test process talks to the same channel layer as the portal (placement pushes)."""
    settings.REDIS_URL = REDIS_URL
    return redis_channel_layer(REDIS_URL)


@pytest.fixture
def portal(transactional_db, redis_layer, tmp_path):
    server = Portal(tmp_path)
    server.start()
    yield server
    server.stop()
    if os.environ.get("SHOW_DAPHNE_LOG"):
        print(server.log.read_text())


class Agents:
    """Real `python -m agents --simulate` processes."""

    def __init__(self, portal: Portal, tmp: Path) -> None:
        self.portal = portal
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []

    def start(self, node: str, token: str, interval: float = 0.2) -> subprocess.Popen:
        log = (self.tmp / f"agent-{node}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "agents", "--portal", self.portal.url, "--simulate", str(INVENTORY),
             "--node", node, "--interval", str(interval), "--backoff-max", "2", "--seed", "1",
             "--log-level", "INFO"],
            cwd=ROOT, env={**os.environ, "TESSERA_AGENT_TOKEN": token}, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def log(self, node: str) -> str:
        return (self.tmp / f"agent-{node}.log").read_text()

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def agents(portal, tmp_path):
    fleet = Agents(portal, tmp_path)
    yield fleet
    fleet.stop_all()


def session_cookie(user) -> str:
    """A signed-in browser's Cookie header (the session row is committed: the server sees it)."""
    client = Client()
    client.force_login(user)
    return f"{django_settings.SESSION_COOKIE_NAME}={client.cookies[django_settings.SESSION_COOKIE_NAME].value}"




@pytest.fixture
def world(transactional_db, settings):
    """The demo fleet, teams vision and nlp, alice (vision), bob (nlp), admin (staff), and one
    running reservation per team on a100-node-1: vision's on GPU 0, nlp's on GPU 1."""
    from decimal import Decimal

    from django.contrib.auth import get_user_model
    from django.db import transaction

    from portal.fleet import inventory
    from portal.fleet.models import Gpu, Node
    from portal.reservations import rules, services
    from portal.reservations.models import Reservation
    from portal.reservations.states import State
    from portal.tenancy.models import Membership, Role

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    inventory.load(INVENTORY)
    users = get_user_model().objects
    teams = {slug: make_team(slug, name=slug.upper(), quota_gpu_share=Decimal(4),
                                       quota_memory_mib=500_000, quota_max_gpus=8)
             for slug in ("vision", "nlp")}
    people = {"alice": users.create_user("alice", password="x"), "bob": users.create_user("bob", password="x"),
              "admin": users.create_user("admin", password="x", is_staff=True)}
    Membership.objects.create(user=people["alice"], team=teams["vision"], role=Role.MEMBER)
    Membership.objects.create(user=people["bob"], team=teams["nlp"], role=Role.MEMBER)
    node = Node.objects.get(name="a100-node-1")
    gpus = {g.index: g for g in Gpu.objects.filter(node=node)}
    reservations = {}
    for slug, owner, index in (("vision", "alice", 0), ("nlp", "bob", 1)):
        with transaction.atomic():  # the cycle it asks for, after the commit, finds nothing to place
            r = services.submit(people[owner], rules.ReservationSpec(team=teams[slug], image="img",
                                                                     gpu_request=Decimal("0.5"), gpu_memory_mib=4096))
            services.place(r.pk, node.pk, [services.NewAllocation(gpus[index].pk, Decimal("0.5"), 4096)])
            services.move(r.pk, State.PLACED, State.RUNNING, "its pod runs", "test")
        reservations[slug] = Reservation.objects.get(pk=r.pk)
    return {"teams": teams, "people": people, "node": node, "gpus": gpus, "reservations": reservations}
