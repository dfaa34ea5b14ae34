"""The house's import rules ([tool.importlinter] in pyproject.toml) hold: the portal and the node
agents meet only in wire/, wire/ imports neither side, the placement engine has no Django in it,
and tenancy never imports reservations (the layers contract)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_rules_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout
