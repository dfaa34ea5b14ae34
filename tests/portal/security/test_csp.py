"""Every response carries the strict policy, and no template holds what it would refuse."""

import re
from pathlib import Path

import pytest
from django.test import Client

ROOT = Path(__file__).resolve().parents[3]
TEMPLATE_DIRS = [ROOT / "templates", *ROOT.glob("portal/*/templates")]
INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.I)
EVENT_HANDLER = re.compile(r"<[^>]+\son[a-z]+\s*=", re.I)
STYLE_ELEMENT = re.compile(r"<style\b", re.I)
JS_URL = re.compile(r"""(href|src|action)\s*=\s*["']\s*javascript:""", re.I)
COMMENTS = re.compile(r"\{#.*?#\}|\{%\s*comment\s*%\}.*?\{%\s*endcomment\s*%\}|<!--.*?-->", re.S)


def _templates():
    for folder in TEMPLATE_DIRS:
        yield from folder.rglob("*.html")


@pytest.mark.parametrize("pattern", [INLINE_SCRIPT, EVENT_HANDLER, STYLE_ELEMENT, JS_URL],
                         ids=["inline script", "on* handler", "style element", "javascript: URL"])
def test_no_template_needs_what_the_policy_refuses(pattern):
    found = [f"{t.relative_to(ROOT)}: {m.group(0)[:60]}" for t in _templates()
             for m in pattern.finditer(COMMENTS.sub("", t.read_text()))]
    assert found == [], "move it to static/js or static/css"


@pytest.mark.parametrize("path", ["/login/", "/api/v1/teams/", "/api/schema/", "/no-such-page/", "/admin/login/"])
def test_every_response_carries_the_policy(db, path):
    policy = Client().get(path)["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["script-src"] == "'self'"
    assert directives["default-src"] == "'self'" and directives["object-src"] == "'none'"
    assert "unsafe" not in directives["style-src"] and directives["frame-ancestors"] == "'none'"
