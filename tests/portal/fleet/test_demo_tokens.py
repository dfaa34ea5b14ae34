"""In the demo, a node token issued in the portal (the fleet page's rotate) is written to the
simulated fleet's tokens file after commit; elsewhere nothing is written."""

from __future__ import annotations

from unittest import mock

import pytest
import yaml

from portal.fleet import services
from portal.fleet.models import Node

pytestmark = pytest.mark.django_db


def test_a_rotated_token_lands_in_the_demo_tokens_file(fleet, settings, tmp_path, django_capture_on_commit_callbacks):
    path = tmp_path / "agent-tokens.yaml"
    path.write_text("a100-node-1: tnode_old\nt4-node-1: tnode_other\n")
    settings.TESSERA_DEMO_TOKENS_FILE = str(path)
    node = Node.objects.get(name="a100-node-1")
    with django_capture_on_commit_callbacks(execute=True):
        key = services.issue_node_token(node)
    assert yaml.safe_load(path.read_text()) == {"a100-node-1": key, "t4-node-1": "tnode_other"}
    assert services.node_for_token(key) == node


def test_outside_the_demo_no_file_is_written(fleet, settings, django_capture_on_commit_callbacks):
    settings.TESSERA_DEMO_TOKENS_FILE = ""
    with mock.patch("portal.fleet.demo_tokens.remember") as remember, \
            django_capture_on_commit_callbacks(execute=True):
        services.issue_node_token(Node.objects.get(name="a100-node-1"))
    remember.assert_not_called()


def test_the_demo_keeps_the_tokens_that_still_work(fleet, tmp_path):
    from portal.web.management.commands.demo import Command

    path = tmp_path / "agent-tokens.yaml"
    assert Command()._write_tokens(path) == (0, Node.objects.count())
    first = yaml.safe_load(path.read_text())
    assert Command()._write_tokens(path) == (Node.objects.count(), 0)  # a second start rotates nothing
    assert yaml.safe_load(path.read_text()) == first
    path.write_text(path.read_text().replace(first["t4-node-1"], "tnode_stale"))
    assert Command()._write_tokens(path) == (Node.objects.count() - 1, 1)  # only the stale one is new
    again = yaml.safe_load(path.read_text())
    assert again["t4-node-1"] not in (first["t4-node-1"], "tnode_stale")
    assert {k: v for k, v in again.items() if k != "t4-node-1"} == {k: v for k, v in first.items() if k != "t4-node-1"}
