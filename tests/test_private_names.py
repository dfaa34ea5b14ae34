"""No module uses another module's private names (ARCHITECTURE.md, "The frameworks' internals"):
neither `from x import _y` nor `x._y` where `x` is a module or a name imported from one of ours.
The frameworks' undocumented internals are reached only in portal/internals.py (its own test,
tests/portal/test_internals.py, compares each with the public API)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = ("portal", "scheduler", "agents", "wire", "tests", "bench")
# Underscore names that are documented public API: Django's model options, default manager and
# instance state; namedtuple's methods.
DOCUMENTED = {"_meta", "_default_manager", "_state", "_fields", "_make", "_replace", "_asdict"}
# Each is a test reaching a private name, named here so that no new one comes in unnoticed (none today).
KNOWN: set[tuple[str, str]] = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in DOCUMENTED


def _uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    imported: set[str] = set()  # names bound to our modules or to names taken from them
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            parts = module.split(".")
            source = ".".join(parts[:len(parts) - node.level] + ([node.module] if node.module else [])) \
                if node.level else node.module or ""
            for alias in node.names:
                if source != module and _private(alias.name):
                    found.append(f"from {source} import {alias.name}")
                if source.split(".")[0] in OURS or node.level:
                    imported.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OURS:
                    imported.add((alias.asname or alias.name).split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in imported:
                found.append(f"{ast.unparse(node.value)}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names() -> None:
    found = []
    for top in OURS:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "migrations" in path.parts or path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            rel = str(path.relative_to(ROOT))
            found += [f"{rel}: {use}" for use in _uses(path) if (rel, use) not in KNOWN]
    assert found == [], "\n".join(found)
