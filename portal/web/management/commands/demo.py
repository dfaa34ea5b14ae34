"""`manage.py demo`: the whole system on one machine with embedded defaults.

Refuses to start, before touching anything, when its port is taken. Then migrates the database
(SQLite unless DATABASE_URL says otherwise), seeds the demo fleet, people and a week of usage
history, gives each node a token (keeping the ones in var/agent-tokens.yaml that still work, so a
fleet already running on them is never cut off), and runs the portal (HTTP + WebSocket), the
placement workers (Celery on the local Redis when one answers, else in-process) and simulated node
agents until Ctrl-C or SIGTERM, which stop every process it started: each is asked to stop (SIGTERM
to it alone, so Celery's worker finishes its running tasks and stops its own pool), and whatever is
left of its process group after the grace is killed, so no pool process is left behind.

Redis: REDIS_URL, else TESSERA_DEMO_REDIS_URL (default redis://127.0.0.1:6379/0) when it answers;
its keys are prefixed with TESSERA_REDIS_PREFIX (default "tessera-demo:"). Both are printed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

LOCAL_REDIS = "redis://127.0.0.1:6379/0"
DEMO_PREFIX = "tessera-demo:"
STOP_GRACE_S = 10


class Stop(Exception):
    """SIGTERM: leave the run loop and stop the children, as Ctrl-C does."""


def redis_answers(url: str) -> bool:
    try:
        import redis

        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except Exception:
        return False


def port_taken(host: str, port: int) -> bool:
    """Whether something listens on host:port (SO_REUSEADDR: a closed connection's TIME_WAIT is no owner)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def port_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class Command(BaseCommand):
    help = "Run Tessera on embedded defaults: portal, placement workers and simulated GPU nodes."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-agents", action="store_true", help="do not start simulated node agents")
        parser.add_argument("--no-redis", action="store_true",
                            help="run tasks in-process even if a local Redis answers")
        parser.add_argument("--no-history", action="store_true", help="do not seed the week of usage history")

    def handle(self, port: int, no_agents: bool, no_redis: bool, no_history: bool, **options):
        if port_taken("127.0.0.1", port):  # before any side effect: nothing migrated, no token touched
            raise CommandError(f"port {port} is already in use (another Tessera demo, or another program): stop it "
                               f"or choose another port with `manage.py demo --port N`. Nothing was started.")
        signal.signal(signal.SIGTERM, self._on_sigterm)
        root = Path(settings.BASE_DIR)
        var = root / "var"
        var.mkdir(exist_ok=True)
        env = dict(os.environ)
        wanted_redis = settings.REDIS_URL or os.environ.get("TESSERA_DEMO_REDIS_URL", LOCAL_REDIS)
        redis_url = "" if no_redis else (wanted_redis if redis_answers(wanted_redis) else "")
        prefix = os.environ.get("TESSERA_REDIS_PREFIX", DEMO_PREFIX)
        if redis_url:
            # This process's settings were read before; the children get the Redis-backed ones.
            env.update(REDIS_URL=redis_url, TESSERA_REDIS_PREFIX=prefix)
        else:
            env.pop("REDIS_URL", None)
        tokens = var / "agent-tokens.yaml"
        env["TESSERA_DEMO_TOKENS_FILE"] = str(tokens)  # rotating a token in the fleet page updates it
        try:
            call_command("migrate", verbosity=0)
            call_command("seed_demo", inventory=settings.TESSERA_INVENTORY)
            if not no_history:
                from portal.web.demo_history import seed_week

                made = seed_week()
                self.stdout.write(f"Usage history: {made} past reservations added." if made
                                  else "Usage history: already seeded (nothing added).")
            kept, issued = self._write_tokens(tokens)
        except (KeyboardInterrupt, Stop):  # stopped while preparing: no process was started yet
            self.stderr.write("Stopped before starting anything.")
            return
        self.stdout.write(f"Node tokens: {kept} kept from {tokens.relative_to(root)}, {issued} issued.")

        python = sys.executable
        manage = str(root / "manage.py")
        self.children: list[subprocess.Popen] = []

        def start(*args: str) -> None:
            # Its own process group (and session): what is left of it after the grace is killed whole.
            self.children.append(subprocess.Popen(list(args), env=env, cwd=root, start_new_session=True))

        try:
            start(python, manage, "runserver", f"127.0.0.1:{port}", "--noreload")
            if redis_url:
                start(python, "-m", "celery", "-A", "portal", "worker", "--loglevel", "WARNING", "--concurrency", "2")
                start(python, "-m", "celery", "-A", "portal", "beat", "--loglevel", "WARNING",
                      "--schedule", str(var / "celerybeat-schedule"))
            else:
                start(python, manage, "placement_loop")  # stands in for beat; tasks run in-process
            self._wait_for_portal(port)
            if not no_agents:
                start(python, "-m", "agents.fleet", "--portal", f"http://127.0.0.1:{port}",
                      "--simulate", settings.TESSERA_INVENTORY, "--tokens", str(tokens))
            mode = (f"Celery on Redis {redis_url}, keys prefixed '{prefix}' (set TESSERA_DEMO_REDIS_URL and "
                    "TESSERA_REDIS_PREFIX to change)") if redis_url else "in-process tasks (no Redis answered)"
            self.stdout.write(self.style.SUCCESS(
                f"\nTessera is running: open http://127.0.0.1:{port}/  ({mode})\n"
                "Sign in as alice, bob, carol, dave or admin with password tessera-demo. "
                "Ctrl-C (or SIGTERM) stops everything.\n"))
            while all(c.poll() is None for c in self.children):
                time.sleep(0.5)
            failed = [c.args for c in self.children if c.poll() not in (None, 0)]
            if failed:
                self.stderr.write(f"a component stopped: {failed[0]}")
        except (KeyboardInterrupt, Stop):
            pass
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the clean-up short
            self._stop_children()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def _on_sigterm(self, signum, frame):
        raise Stop()

    def _wait_for_portal(self, port: int) -> None:
        while not port_answers("127.0.0.1", port):
            if self.children[0].poll() is not None:
                raise CommandError(f"the portal stopped before answering on port {port}")
            time.sleep(0.2)

    def _stop_children(self) -> None:
        # Not the group: a pool process signalled beside its worker dies mid-task (WorkerLostError).
        for c in self.children:
            with contextlib.suppress(ProcessLookupError):
                c.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for c in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.wait(timeout=max(0.1, deadline - time.monotonic()))
        for c in self.children:  # what is left of each group (a pool process, a stuck child)
            self._signal_group(c, signal.SIGKILL)
            c.wait()

    @staticmethod
    def _signal_group(child: subprocess.Popen, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # the group has gone already
            os.killpg(child.pid, sig)

    def _write_tokens(self, path: Path) -> tuple[int, int]:
        """Each node's token: the one in `path` while it still works (a fleet started before keeps
        running on it), else a new one. Returns (kept, issued)."""
        from portal.fleet import services
        from portal.fleet.models import Node
        from wire.fleet_tokens import format_tokens, read_tokens

        try:
            known = read_tokens(path) if path.exists() else {}
        except ValueError:
            known = {}
        tokens, kept, issued = {}, 0, 0
        for node in Node.objects.order_by("name"):
            key = known.get(node.name)
            found = services.node_for_token(key) if key else None
            if found is not None and found.pk == node.pk:
                kept += 1
            else:
                key = services.issue_node_token(node)
                issued += 1
            tokens[node.name] = key
        if issued or not path.exists():
            path.write_text(format_tokens(tokens))
        path.chmod(0o600)
        return kept, issued
