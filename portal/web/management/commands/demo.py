"""`manage.py demo`: the whole system on one machine with embedded defaults.

Migrates the database (SQLite unless DATABASE_URL says otherwise), seeds the demo fleet and people,
issues node tokens, then runs the portal (HTTP + WebSocket), the placement workers (Celery on the local
Redis when one answers, else in-process) and simulated node agents, until Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

LOCAL_REDIS = "redis://127.0.0.1:6379/0"


def redis_answers(url: str) -> bool:
    try:
        import redis

        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except Exception:
        return False


class Command(BaseCommand):
    help = "Run Tessera on embedded defaults: portal, placement workers and simulated GPU nodes."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-agents", action="store_true", help="do not start simulated node agents")
        parser.add_argument("--no-redis", action="store_true",
                            help="run tasks in-process even if a local Redis answers")

    def handle(self, port: int, no_agents: bool, no_redis: bool, **options):
        root = Path(settings.BASE_DIR)
        var = root / "var"
        var.mkdir(exist_ok=True)
        env = dict(os.environ)
        redis_url = settings.REDIS_URL or (LOCAL_REDIS if redis_answers(LOCAL_REDIS) else "")
        if no_redis:
            redis_url = ""
            env.pop("REDIS_URL", None)
        if redis_url:
            # This process's settings were read before; the children get the Redis-backed ones.
            env["REDIS_URL"] = redis_url
        call_command("migrate", verbosity=0)
        call_command("seed_demo", inventory=settings.TESSERA_INVENTORY)
        tokens = var / "agent-tokens.yaml"
        self._write_tokens(tokens)

        python = sys.executable
        manage = str(root / "manage.py")
        children: list[subprocess.Popen] = []

        def start(*args: str) -> None:
            children.append(subprocess.Popen(list(args), env=env, cwd=root))

        start(python, manage, "runserver", f"127.0.0.1:{port}", "--noreload")
        if redis_url:
            start(python, "-m", "celery", "-A", "portal", "worker", "--loglevel", "WARNING", "--concurrency", "2")
            start(python, "-m", "celery", "-A", "portal", "beat", "--loglevel", "WARNING",
                  "--schedule", str(var / "celerybeat-schedule"))
        else:
            start(python, manage, "placement_loop")  # stands in for beat; tasks run in-process
        if not no_agents:
            time.sleep(2)  # let the portal open its port; agents would retry anyway
            start(python, "-m", "agents.fleet", "--portal", f"http://127.0.0.1:{port}",
                  "--simulate", settings.TESSERA_INVENTORY, "--tokens", str(tokens))
        mode = f"Celery on {redis_url}" if redis_url else "in-process tasks (no Redis answered)"
        self.stdout.write(self.style.SUCCESS(
            f"\nTessera is running: open http://127.0.0.1:{port}/  ({mode})\n"
            "Sign in as alice, bob, carol, dave or admin with password tessera-demo. Ctrl-C stops everything.\n"))
        try:
            while all(c.poll() is None for c in children):
                time.sleep(0.5)
            failed = [c.args for c in children if c.poll() not in (None, 0)]
            if failed:
                self.stderr.write(f"a component stopped: {failed[0]}")
        except KeyboardInterrupt:
            pass
        finally:
            for c in children:
                if c.poll() is None:
                    c.send_signal(signal.SIGTERM)
            for c in children:
                try:
                    c.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    c.kill()

    def _write_tokens(self, path: Path) -> None:
        from portal.fleet import services
        from portal.fleet.models import Node

        lines = [f"{node.name}: {services.issue_node_token(node)}" for node in Node.objects.order_by("name")]
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)
