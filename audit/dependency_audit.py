"""Offline dependency audit: the pinned versions in pyproject.toml against a vendored snapshot of
the PyPA advisory database (OSV records, audit/advisories/pypi/<package>/*.yaml).

Works without network: CI and `make test` run it (tests/audit/test_dependency_audit.py) and fail
on a pin that a known advisory affects. Refresh the snapshot with audit/refresh.sh; accept an
advisory that does not apply to us only in audit/accepted.yaml, with the reason.

    python -m audit.dependency_audit            # exit 1 and a list when a pin is affected
"""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ADVISORIES = HERE / "advisories" / "pypi"
ACCEPTED = HERE / "accepted.yaml"


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@cache
def _record(file: Path) -> dict:
    return yaml.load(file.read_text(), Loader=_Loader)  # noqa: S506 (a safe loader)


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Finding:
    package: str
    version: str
    advisory: str
    aliases: tuple[str, ...]
    fixed: tuple[str, ...]
    summary: str

    def __str__(self) -> str:
        fix = f"fixed in {', '.join(self.fixed)}" if self.fixed else "no fixed version"
        also = f" ({', '.join(self.aliases)})" if self.aliases else ""
        return f"{self.package}=={self.version}: {self.advisory}{also}, {fix}: {self.summary}"


def pins(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """package → exact version, from the dependencies and every optional group. An unpinned
    requirement is an error: an audit of ranges says nothing about what CI installs."""
    project = tomllib.loads(pyproject.read_text())["project"]
    lines = list(project.get("dependencies", []))
    for group in project.get("optional-dependencies", {}).values():
        lines.extend(group)
    found: dict[str, str] = {}
    for line in lines:
        req = Requirement(line)
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if len(exact) != 1:
            raise ValueError(f"{line!r} is not pinned with ==")
        found[normalise(req.name)] = exact[0]
    return found


def _affected_by_ranges(version: Version, ranges: list[dict]) -> bool:
    for rng in ranges:
        if rng.get("type") not in ("ECOSYSTEM", "SEMVER"):
            continue
        events = []
        for event in rng.get("events", []):
            (kind, raw), = event.items()
            try:
                at = Version("0") if raw == "0" else Version(str(raw))
            except InvalidVersion:
                continue
            events.append((at, 0 if kind == "introduced" else 1, kind))
        affected = False
        for at, _, kind in sorted(events):
            if kind == "introduced" and version >= at:
                affected = True
            elif (kind == "fixed" and version >= at) or (kind == "last_affected" and version > at):
                affected = False
        if affected:
            return True
    return False


def affects(record: dict, package: str, version: str) -> tuple[bool, tuple[str, ...]]:
    """Whether an OSV record names this package at this version; and its fixed versions."""
    if record.get("withdrawn"):
        return False, ()
    try:
        v = Version(version)
    except InvalidVersion:
        return False, ()
    for entry in record.get("affected", []):
        pkg = entry.get("package", {})
        if pkg.get("ecosystem") != "PyPI" or normalise(pkg.get("name", "")) != package:
            continue
        fixed = tuple(str(e["fixed"]) for r in entry.get("ranges", []) for e in r.get("events", []) if "fixed" in e)
        listed = {str(x) for x in entry.get("versions", [])}
        if version in listed or _affected_by_ranges(v, entry.get("ranges", [])):
            return True, fixed
    return False, ()


def accepted(path: Path = ACCEPTED) -> set[tuple[str, str]]:
    if not path.exists():
        return set()
    entries = yaml.safe_load(path.read_text()) or []
    for e in entries:
        if not str(e.get("reason", "")).strip():
            raise ValueError(f"{path.name}: {e.get('id')} for {e.get('package')} needs a reason")
    return {(normalise(e["package"]), e["id"]) for e in entries}


def audit(pinned: dict[str, str], advisories: Path = ADVISORIES,
          accepted_ids: set[tuple[str, str]] | None = None) -> list[Finding]:
    accepted_ids = accepted() if accepted_ids is None else accepted_ids
    findings = []
    for package, version in sorted(pinned.items()):
        folder = advisories / package
        if not folder.is_dir():
            continue
        for file in sorted(folder.glob("*.yaml")):
            record = _record(file)
            hit, fixed = affects(record, package, version)
            if hit and (package, record["id"]) not in accepted_ids:
                summary = " ".join(str(record.get("summary") or record.get("details", "")).split())[:160]
                findings.append(Finding(package, version, record["id"], tuple(record.get("aliases") or ()),
                                        fixed, summary))
    return findings


def main() -> int:
    findings = audit(pins())
    snapshot = (HERE / "SNAPSHOT").read_text().splitlines()
    print(f"dependency audit of {len(pins())} pins against {snapshot[1]} ({snapshot[2]})")
    for f in findings:
        print(f"  VULNERABLE {f}")
    print(f"{len(findings)} known vulnerable pins")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
