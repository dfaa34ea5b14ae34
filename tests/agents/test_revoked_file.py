"""The GPU node's agent keeps the remote server's revoked-share file (`--revoked-file`): what the
portal's `revoked_shares` lists, replaced whole so the server never reads half a list."""

from __future__ import annotations

import os
import stat

import pytest

from agents.remote.revocations import RevokedFile
from wire.agent_portal import RevokedShares

AT = 1_800_000_000


def _message(*shares: tuple[str, int]) -> RevokedShares:
    return RevokedShares.model_validate({"v": 1, "type": "revoked_shares",
                                         "shares": [{"share": s, "at": at, "from_attempt": 3} for s, at in shares]})


def test_the_file_lists_each_share_when_it_ended_and_its_first_valid_attempt_one_a_line(tmp_path):
    path = tmp_path / "revoked"
    assert RevokedFile(path).write(_message(("812", AT), ("team:job-1", AT + 7)))
    assert path.read_text() == f"812 {AT} 3\nteam:job-1 {AT + 7} 3\n"
    # The server runs as another user: it must be able to read it, nobody else to change it.
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert os.listdir(tmp_path) == ["revoked"]  # no temporary file left behind


def test_each_new_list_replaces_the_file_by_rename_never_in_place(tmp_path):
    path = tmp_path / "revoked"
    revoked = RevokedFile(path)
    revoked.write(_message(("1", AT)))
    reader = path.open()  # the server holding the old file reads it whole, unchanged
    first = path.stat().st_ino
    assert revoked.write(_message(("1", AT), ("2", AT + 1)))
    assert path.stat().st_ino != first  # a new inode: how the server notices the change
    assert reader.read() == f"1 {AT} 3\n"
    reader.close()
    assert path.read_text() == f"1 {AT} 3\n2 {AT + 1} 3\n"
    # A share that has aged out of the portal's window leaves the list, and so the file.
    revoked.write(_message(("2", AT + 1)))
    assert path.read_text() == f"2 {AT + 1} 3\n"


def test_the_same_list_again_does_not_touch_the_file(tmp_path):
    path = tmp_path / "revoked"
    revoked = RevokedFile(path)
    revoked.write(_message(("1", AT)))
    inode = path.stat().st_ino
    assert not revoked.write(_message(("1", AT)))
    assert path.stat().st_ino == inode


def test_a_failed_write_keeps_the_previous_file_whole_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "revoked"
    revoked = RevokedFile(path)
    revoked.write(_message(("1", AT)))

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError):
        revoked.write(_message(("1", AT), ("2", AT)))
    revoked.apply(_message(("3", AT)))  # the stream's callback logs instead of raising
    assert path.read_text() == f"1 {AT} 3\n"
    assert os.listdir(tmp_path) == ["revoked"]



@pytest.mark.asyncio
async def test_an_agent_with_a_revoked_file_asks_for_revocations_and_writes_what_the_portal_sends(portal, tmp_path):
    from agents.agent import Agent

    from .conftest import make_agent, running

    plain = make_agent(portal.url)
    path = tmp_path / "revoked"
    agent = Agent(plain.settings, plain.source, plain.placements, revoked=RevokedFile(path))
    assert plain.hello.revocations is False
    async with running(agent):
        await portal.wait_for(lambda: portal.hellos)
        assert portal.hellos[0].revocations is True
        await portal.push({"v": 1, "type": "revoked_shares", "shares": [{"share": "812", "at": AT, "from_attempt": 2}]})
        await portal.wait_for(lambda: path.exists())
        refused = [{"share": "a", "at": 1, "from_attempt": 2}]  # `at` out of range
        await portal.push({"v": 1, "type": "revoked_shares", "shares": refused})
        await portal.wait_for(lambda: portal.errors_from_agent)
    assert portal.errors_from_agent[0]["code"] == "invalid_message"
    assert path.read_text() == f"812 {AT} 2\n"  # a refused list changes nothing
