"""The offline dependency audit: our pins are clear of the vendored advisories, and the audit
does catch a pin that an advisory names (so a clean result means something)."""

import pytest

from audit import dependency_audit as audit


def test_pinned_dependencies_have_no_known_advisory():
    findings = audit.audit(audit.pins())
    assert findings == [], "\n".join(map(str, findings))


def test_every_requirement_is_pinned():
    assert audit.pins()["django"]  # and pins() raised for none unpinned


def test_a_known_vulnerable_pin_is_caught():
    ids = {f.advisory for f in audit.audit({"django": "4.2.14"}, accepted_ids=set())}
    assert "PYSEC-2024-70" in ids  # CVE-2024-42005, fixed in 4.2.15
    assert "PYSEC-2024-70" not in {f.advisory for f in audit.audit({"django": "4.2.15"}, accepted_ids=set())}
    assert audit.audit({"pyyaml": "5.3"}, accepted_ids=set())  # CVE-2020-14343


def test_accepting_an_advisory_takes_a_reason(tmp_path):
    (tmp_path / "accepted.yaml").write_text("- {package: django, id: PYSEC-2024-70, reason: ''}\n")
    with pytest.raises(ValueError, match="needs a reason"):
        audit.accepted(tmp_path / "accepted.yaml")
    (tmp_path / "accepted.yaml").write_text("- {package: Django, id: PYSEC-2024-70, reason: no JSONField}\n")
    ok = audit.accepted(tmp_path / "accepted.yaml")
    assert "PYSEC-2024-70" not in {f.advisory for f in audit.audit({"django": "4.2.14"}, accepted_ids=ok)}


def test_unpinned_requirement_is_refused(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["Django>=5"]\n')
    with pytest.raises(ValueError, match="not pinned"):
        audit.pins(tmp_path / "pyproject.toml")


@pytest.mark.parametrize(("version", "hit"), [("1.0", False), ("1.1", True), ("1.4", True), ("1.5", False),
                                              ("2.0", True), ("2.2", True), ("2.3", False)])
def test_osv_ranges(version, hit):
    record = {"id": "X", "affected": [{"package": {"ecosystem": "PyPI", "name": "Pkg_A"}, "ranges": [
        {"type": "ECOSYSTEM", "events": [{"introduced": "2.0"}, {"last_affected": "2.2"},
                                         {"introduced": "1.1"}, {"fixed": "1.5"}]}]}]}
    assert audit.affects(record, "pkg-a", version)[0] is hit
