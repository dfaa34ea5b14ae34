"""The whole stack for browser tests: Daphne (the integration suite's `Portal`), a Celery worker
with its beat on Redis (placement cycles, binds, the pod watch that moves placed → running), the
simulated cluster in a file both share, and real simulated agents."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT, Agents, Portal

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


class Worker:
    """`celery -A portal worker -B` (solo pool: one task at a time, as small as it gets)."""

    def __init__(self, portal: Portal, tmp: Path) -> None:
        self.env = dict(portal.env)
        self.tmp = tmp
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = (self.tmp / "celery.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "portal", "worker", "-B", "-P", "solo", "--loglevel", "WARNING",
             "-s", str(self.tmp / "beat-schedule"), "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@pytest.fixture
def stack(transactional_db, redis_layer, tmp_path, settings):
    """Daphne and (not yet started: the test starts it when it wants the queue to move) a Celery
    worker, on the test database and this suite's Redis database, sharing one simulated cluster.
    The test's own process shares it too: what it does through the services may run placement in
    this process, which must see the same pods (not the repository's var/ cluster, left behind by
    earlier runs, where a new reservation's pod name was an old pod's)."""
    from portal.placement.backend import forget_backends

    cluster = {"TESSERA_LOCAL_STATE": str(tmp_path / "cluster.sqlite3"), "TESSERA_LOCAL_START_S": "2",
               "TESSERA_LOCAL_BATCH_S": "3600"}
    settings.TESSERA_LOCAL_STATE = cluster["TESSERA_LOCAL_STATE"]
    settings.TESSERA_LOCAL_START_S = float(cluster["TESSERA_LOCAL_START_S"])
    settings.TESSERA_LOCAL_BATCH_S = float(cluster["TESSERA_LOCAL_BATCH_S"])
    forget_backends()
    portal = Portal(tmp_path)
    portal.env.update({"CELERY_TASK_ALWAYS_EAGER": "0", **cluster})
    portal.start()
    worker = Worker(portal, tmp_path)
    agents = Agents(portal, tmp_path)
    yield {"portal": portal, "worker": worker, "agents": agents, "tmp": tmp_path}
    agents.stop_all()
    worker.stop()
    portal.stop()
    forget_backends()
    if os.environ.get("SHOW_STACK_LOGS"):
        for name in ("daphne.log", "celery.log"):
            path = tmp_path / name
            if path.exists():
                print(f"---- {name}\n{path.read_text()[-8000:]}")


def sign_in(page, base: str, username: str, password: str) -> None:
    """Through the login form, as a person does; back on the home page when it is done."""
    page.goto(f"{base}/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")


def shoot(page, name: str, dark: bool = False) -> None:
    """Screenshots of the page at desktop width and at 390 px (a phone), full length; with `dark`,
    also the desktop one in the dark colour scheme."""
    ARTIFACTS.mkdir(exist_ok=True)
    size = page.viewport_size
    for label, width in (("desktop", 1280), ("390", 390)):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(250)  # charts resize after 150 ms
        page.screenshot(path=str(ARTIFACTS / f"{name}-{label}.png"), full_page=True)
    page.set_viewport_size(size)
    if dark:
        page.emulate_media(color_scheme="dark")
        page.wait_for_timeout(250)
        page.screenshot(path=str(ARTIFACTS / f"{name}-dark.png"), full_page=True)
        page.emulate_media(color_scheme="light")
