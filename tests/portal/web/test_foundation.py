"""The front-end foundation: one layout, navigation by role, vendored assets, no inline script."""

import json
import re
from hashlib import sha256
from pathlib import Path

import pytest
from django.test import Client

from portal.web import navigation

ROOT = Path(__file__).resolve().parents[3]


def _nav_labels(client) -> list[str]:
    html = client.get("/").content.decode()
    nav = re.search(r'<nav class="nav" aria-label="Main">(.*?)</nav>', html, re.S).group(1)
    return re.findall(r">([^<>]+)</a>", nav)


def _signed_in(people, name) -> Client:
    client = Client()
    client.force_login(people[name])
    return client


def test_navigation_shows_each_role_what_it_may_use(people):
    member = _nav_labels(_signed_in(people, "alice"))
    assert "Request GPU" in member and "Django admin" not in member
    manager = _nav_labels(_signed_in(people, "dave"))  # vision manager: reads, never submits
    assert "Request GPU" not in manager and "Home" in manager
    staff = _nav_labels(_signed_in(people, "admin"))
    assert "Django admin" in staff and "Request GPU" in staff


def test_navigation_registry_takes_a_one_line_entry(people, rf):
    navigation.register("Team settings", "/team/", allowed=navigation.team_admin, order=30)
    try:
        request = rf.get("/team/members/")
        request.user = people["carol"]  # vision team admin
        links = {link.label: link for link in navigation.entries_for(request)}
        assert links["Team settings"].current and not links["Home"].current
        request.user = people["alice"]
        assert "Team settings" not in {link.label for link in navigation.entries_for(request)}
    finally:
        navigation.unregister("Team settings")


def test_current_page_is_marked(people):
    html = _signed_in(people, "alice").get("/reservations/new/").content.decode()
    assert re.search(r'<a href="/reservations/new/" aria-current="page">Request GPU</a>', html)


def test_signed_out_layout_has_no_navigation(db):
    html = Client().get("/login/").content.decode()
    assert 'aria-label="Main"' not in html and "favicon.svg" in html


def test_vendored_assets_match_their_manifest():
    vendor = ROOT / "static" / "vendor"
    manifest = json.loads((vendor / "MANIFEST.json").read_text())
    names = {p["package"]: p for p in manifest["packages"]}
    assert set(names) == {"htmx.org", "uplot", "@xterm/xterm", "@xterm/addon-fit"}
    for package in manifest["packages"]:
        assert package["license"] and re.fullmatch(r"\d+\.\d+\.\d+", package["version"])
        for name, digest in package["files"].items():
            assert sha256((vendor / package["folder"] / name).read_bytes()).hexdigest() == digest, name


TEMPLATES = sorted((ROOT / "templates").rglob("*.html"))


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: str(p.relative_to(ROOT / "templates")))
def test_no_inline_script_or_handler(path):
    """A strict CSP is coming: scripts only from files, no on* attributes, no javascript: URLs."""
    html = path.read_text()
    for tag in re.findall(r"<script\b[^>]*>", html):
        assert "src=" in tag or 'type="application/json"' in tag, f"inline script in {path.name}: {tag}"
    assert not re.search(r"\son[a-z]+\s*=", html), f"inline event handler in {path.name}"
    assert "javascript:" not in html
