"""The remote server's revoked-share file (`--revoked-file`, preload/remote/README.md), written by
the GPU node's agent from the portal's `revoked_shares` (wire/PROTOCOL.md 5.5).

One `<share id> <unix seconds> <attempt>` a line: the server refuses the share's tokens issued for
a placement before <attempt> (wire/PROTOCOL.md 5.5). The file is replaced whole (a temporary file in the same
directory, then rename): the server, which reloads it when its inode changes, never reads half a
list. The portal sends the complete recent list, bounded by MAX_REVOKED_SHARES, so the file holds
exactly its latest list: a share placed here again after a preemption stays in it with its new
attempt, so that only its new token works.
"""

from __future__ import annotations

import logging
from pathlib import Path

from agents.remote.files import write_whole
from wire.agent_portal import RevokedShares

log = logging.getLogger(__name__)


def file_text(message: RevokedShares) -> str:
    return "".join(f"{s.share} {s.at} {s.from_attempt}\n" for s in message.shares)


class RevokedFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._written: str | None = None

    def write(self, message: RevokedShares) -> bool:
        """Replace the file with `message`'s shares; False if it already said that. Raises OSError."""
        text = file_text(message)
        if text == self._written:
            return False
        write_whole(self.path, text)
        self._written = text
        log.info("revoked-share file %s: %d share(s)", self.path, len(message.shares))
        return True

    def apply(self, message: RevokedShares) -> None:
        """The stream's callback: a failed write is logged; the portal sends the list again at the
        next change or session, and the tokens expire anyway."""
        try:
            self.write(message)
        except OSError as exc:
            log.error("cannot write the revoked-share file %s: %s", self.path, exc)

