"""The bounded local buffer of encoded samples that are not yet acknowledged by the portal.

Samples enter in sequence order and leave only when the portal acknowledges them, or, when the
buffer is full, from the oldest end (counted in `dropped`, which every batch reports). Sequence
numbers in the buffer are therefore always consecutive, so a position is `seq - first_seq`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import islice


@dataclass(frozen=True)
class Entry:
    seq: int
    text: str  # the sample as JSON, encoded once when it was taken
    size: int  # UTF-8 bytes of `text`


class SampleBuffer:
    def __init__(self, max_samples: int, max_bytes: int) -> None:
        if max_samples < 1 or max_bytes < 1:
            raise ValueError("the buffer must hold at least one sample")
        self.max_samples = max_samples
        self.max_bytes = max_bytes
        self._entries: deque[Entry] = deque()
        self._bytes = 0
        self.dropped = 0  # samples thrown away unacknowledged because the buffer was full
        self.acked_seq = 0  # highest sequence number the portal has confirmed

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def first_seq(self) -> int | None:
        return self._entries[0].seq if self._entries else None

    @property
    def last_seq(self) -> int | None:
        return self._entries[-1].seq if self._entries else None

    def append(self, seq: int, text: str) -> int:
        """Add the next sample; returns how many old samples had to be dropped to make room."""
        if self._entries and seq != self._entries[-1].seq + 1:
            raise ValueError(f"sample {seq} does not follow {self._entries[-1].seq}")
        entry = Entry(seq, text, len(text.encode("utf-8")))
        self._entries.append(entry)
        self._bytes += entry.size
        dropped = 0
        while len(self._entries) > 1 and (
            len(self._entries) > self.max_samples or self._bytes > self.max_bytes
        ):
            old = self._entries.popleft()
            self._bytes -= old.size
            dropped += 1
        self.dropped += dropped
        return dropped

    def ack(self, seq: int) -> int:
        """The portal has stored everything up to `seq`; forget it. Returns how many were removed."""
        self.acked_seq = max(self.acked_seq, seq)
        removed = 0
        while self._entries and self._entries[0].seq <= seq:
            old = self._entries.popleft()
            self._bytes -= old.size
            removed += 1
        return removed

    def after(self, seq: int, max_count: int, max_bytes: int) -> list[Entry]:
        """Up to `max_count` entries (together at most `max_bytes`) that follow `seq`, in order."""
        if not self._entries:
            return []
        start = max(0, seq + 1 - self._entries[0].seq)
        out: list[Entry] = []
        total = 0
        for entry in islice(self._entries, start, None):
            if len(out) >= max_count or (out and total + entry.size > max_bytes):
                break
            out.append(entry)
            total += entry.size
        return out
