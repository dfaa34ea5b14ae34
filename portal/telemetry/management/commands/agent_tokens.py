"""`manage.py agent_tokens --out FILE`: a token for every node, written as the tokens file of
`python -m agents.fleet` (quickstart and benchmarks: simulated agents for the whole fleet)."""

from __future__ import annotations

import os
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from portal.fleet import services
from portal.fleet.models import Node
from wire.fleet_tokens import format_tokens


class Command(BaseCommand):
    help = ("Issue a new agent token for every node (or --nodes) and write them to a YAML file for "
            "`python -m agents.fleet --tokens FILE` (mode 0600). Old tokens of those nodes stop working.")

    def add_arguments(self, parser):
        parser.add_argument("--out", required=True, type=Path, help="the tokens file to write")
        parser.add_argument("--nodes", help="comma-separated node names (default: every node)")

    def handle(self, out: Path, nodes: str | None, **options):
        rows = list(Node.objects.order_by("name"))
        if nodes:
            wanted = [n for n in nodes.split(",") if n]
            unknown = sorted(set(wanted) - {n.name for n in rows})
            if unknown:
                raise CommandError(f"--nodes: no node named {unknown[0]!r}")
            rows = [n for n in rows if n.name in wanted]
        if not rows:
            raise CommandError("there are no nodes (load an inventory first, e.g. manage.py seed_demo)")
        tokens = {node.name: services.issue_node_token(node) for node in rows}
        out.parent.mkdir(parents=True, exist_ok=True)
        # Created private: the file holds credentials.
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(format_tokens(tokens))
        self.stdout.write(f"{len(tokens)} node tokens written to {out}")
