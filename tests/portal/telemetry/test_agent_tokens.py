"""manage.py agent_tokens: the tokens file the simulated fleet reads."""

from __future__ import annotations

import stat

import pytest
from django.core.management import CommandError, call_command

from portal.fleet.models import Node
from portal.fleet.services import node_for_token
from wire.fleet_tokens import read_tokens

pytestmark = pytest.mark.django_db


def test_tokens_file_works_for_the_fleet_and_is_private(fleet, tmp_path):
    out = tmp_path / "var" / "agent-tokens.yaml"
    call_command("agent_tokens", "--out", str(out), "--nodes", "a100-node-1,t4-node-1")
    tokens = read_tokens(out)  # the reader the agent fleet uses accepts it
    assert set(tokens) == {"a100-node-1", "t4-node-1"}
    assert node_for_token(tokens["t4-node-1"]) == Node.objects.get(name="t4-node-1")
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    call_command("agent_tokens", "--out", str(out))
    assert set(read_tokens(out)) == set(Node.objects.values_list("name", flat=True))
    assert node_for_token(tokens["t4-node-1"]) is None  # re-issued: the old one is gone


def test_unknown_nodes_are_refused(fleet, tmp_path):
    with pytest.raises(CommandError, match="no node named 'nope'"):
        call_command("agent_tokens", "--out", str(tmp_path / "t.yaml"), "--nodes", "nope")
