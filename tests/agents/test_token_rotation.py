"""A simulated fleet whose node token is rotated in the portal picks the new one up from its
tokens file when it reconnects, instead of being refused (and lost) until restarted."""

from __future__ import annotations

import functools

import pytest

from agents.fleet import token_in

pytestmark = pytest.mark.asyncio


async def test_the_agent_reconnects_with_the_token_now_in_the_file(portal, agent_tools, tmp_path):
    make_agent, running = agent_tools
    tokens = tmp_path / "agent-tokens.yaml"
    tokens.write_text("v100-node-1: node-token-1\n")
    agent = make_agent(portal.url)
    agent.stream.token_source = functools.partial(token_in, tokens, "v100-node-1")
    async with running(agent):
        await portal.wait_for(lambda: portal.hellos)
        # Rotated: the portal refuses the old token and drops its connection; the file has the new one.
        tokens.write_text("v100-node-1: node-token-2\n")
        portal.token = "node-token-2"
        await portal.kill()
        await portal.start()
        await portal.wait_for(lambda: any(h["Authorization"] == "Bearer node-token-2" for _, h in portal.handshakes))
        seq = portal.last_seq
        await portal.wait_for(lambda: portal.last_seq > seq + 5)  # samples flow again
    assert all(h["Authorization"] in ("Bearer node-token-1", "Bearer node-token-2") for _, h in portal.handshakes)


async def test_an_unreadable_file_keeps_the_token_held(tmp_path):
    assert token_in(tmp_path / "missing.yaml", "v100-node-1") is None
    (tmp_path / "bad.yaml").write_text("- not a mapping\n")
    assert token_in(tmp_path / "bad.yaml", "v100-node-1") is None
