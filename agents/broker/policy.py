"""Who gets the GPU next: the token policy of one GPU, pure (the caller passes the time in).

Gemini's scheme, improved. One process at a time holds the GPU's token for a quantum. Over a sliding
window every share gets at least its request and at most its limit of GPU time:

* a share whose window usage would pass ``limit x window`` waits, even when the GPU is idle;
* among the rest, high-priority shares go first, then the share most below its request
  (lowest usage / (request x window)), so the idle time of others goes to whoever is below its limit
  (work-conserving) in proportion to requests;
* the quantum adapts to the bursts each share really runs (min/max bounds), and while a
  high-priority share is on the GPU low-priority quanta are kept short, so a high-priority burst
  waits at most one short quantum;
* every grant costs a hand-off during which the GPU idles, so a share near its limit waits for a whole
  quantum while someone else can run rather than taking the GPU in slivers of its trickling budget;
* a holder that does not report by the end of its quantum (plus a grace) loses the token.

A new share's window is its age (at least ``start_window_s``), so its limit holds from its first
second rather than only after a full window.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BrokerSettings:
    window_s: float = 10.0
    min_quota_s: float = 0.002
    max_quota_s: float = 0.05
    initial_quota_s: float = 0.02
    low_quota_s: float = 0.004
    grace_s: float = 0.02
    start_window_s: float = 1.0
    # how long a holder that said it is draining (waiting for kernels it queued during its quantum)
    # keeps the token past its deadline: the GPU is still running its work, and granting another
    # process now would only interleave the two on the GPU
    drain_max_s: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.min_quota_s <= self.initial_quota_s <= self.max_quota_s:
            raise ValueError("quotas must satisfy 0 < min <= initial <= max")
        if not self.min_quota_s <= self.low_quota_s <= self.max_quota_s:
            raise ValueError("the low-priority quota must lie between the min and max quotas")
        if not 0 < self.start_window_s <= self.window_s:
            raise ValueError("the start window must be positive and no longer than the window")
        if self.window_s < 10 * self.max_quota_s:
            raise ValueError("the window must hold at least ten maximal quanta")
        if self.grace_s < 0:
            raise ValueError("the grace must not be negative")
        if self.drain_max_s < 0:
            raise ValueError("the drain allowance must not be negative")


@dataclass
class ShareAccount:
    """The broker's account of one share (one reservation on one GPU): its terms and the GPU time it
    used. (`scheduler.core.Share` is the engine's view of a placed share: its terms and labels.)"""

    share_id: str
    gpu_request: float
    gpu_limit: float
    high_priority: bool
    joined_s: float
    quota_s: float
    used_total_s: float = 0.0
    burst_s: float = 0.0
    clients: int = 0
    _entries: deque[tuple[float, float]] = field(default_factory=deque)  # (end time, GPU seconds)
    _window_used_s: float = 0.0

    def charge(self, seconds: float, now: float) -> None:
        if seconds <= 0:
            return
        self._entries.append((now, seconds))
        self._window_used_s += seconds
        self.used_total_s += seconds

    def window_used(self, now: float, window_s: float) -> float:
        while self._entries and self._entries[0][0] <= now - window_s:
            self._window_used_s -= self._entries.popleft()[1]
        if not self._entries:
            self._window_used_s = 0.0  # no drift from float sums
        return max(self._window_used_s, 0.0)

    def effective_window(self, now: float, settings: BrokerSettings) -> float:
        return min(settings.window_s, max(settings.start_window_s, now - self.joined_s))

    def budget(self, now: float, settings: BrokerSettings) -> float:
        """GPU seconds this share may still use in its window."""
        return self.gpu_limit * self.effective_window(now, settings) - self.window_used(now, settings.window_s)

    def eligible_at(self, now: float, need_s: float, settings: BrokerSettings) -> float:
        """The earliest time its budget reaches ``need_s``: as its window grows, or old usage leaves it."""
        used = self.window_used(now, settings.window_s)
        grown = self.joined_s + (used + need_s) / self.gpu_limit
        if grown - self.joined_s <= settings.window_s:
            return max(grown, now)
        allowed = self.gpu_limit * settings.window_s - need_s
        for end, seconds in self._entries:
            used -= seconds
            if used <= allowed:
                return max(end + settings.window_s, now)
        return now + settings.window_s

    def adapt_quota(self, used_s: float, idle: bool, settings: BrokerSettings) -> None:
        if idle:
            # the share went idle inside its quantum: that was a whole burst; fit the quantum to it
            self.burst_s = used_s if self.burst_s == 0 else 0.7 * self.burst_s + 0.3 * used_s
            target = 2 * self.burst_s
        else:
            target = self.quota_s * 1.5
        self.quota_s = min(settings.max_quota_s, max(settings.min_quota_s, target))


@dataclass
class Client:
    """One process of a share."""

    client_id: int
    share: ShareAccount
    pid: int
    waiting_since: float | None = None
    holding: bool = False
    granted_at: float = 0.0
    quota_s: float = 0.0
    deadline: float = 0.0
    revoked_charge_s: float = 0.0


@dataclass(frozen=True)
class Grant:
    client_id: int
    quota_s: float


class GpuScheduler:
    """The token of one GPU."""

    def __init__(self, gpu: str, settings: BrokerSettings) -> None:
        self.gpu = gpu
        self.settings = settings
        self.shares: dict[str, ShareAccount] = {}
        self.clients: dict[int, Client] = {}
        self.holder: Client | None = None
        self.revocations = 0

    # ---- membership ----

    def define_share(self, share_id: str, request: float, limit: float, high: bool, now: float) -> None:
        """Sets a share's terms, as the node agent gives them; its processes' announcements never count."""
        if not 0 < request <= limit <= 1:
            raise ValueError(f"share {share_id}: need 0 < request <= limit <= 1, got {request}, {limit}")
        share = self.shares.get(share_id)
        if share is None:
            share = ShareAccount(share_id, request, limit, high, now, self.settings.initial_quota_s)
            self.shares[share_id] = share
        share.gpu_request, share.gpu_limit, share.high_priority = request, limit, high

    def forget_share(self, share_id: str, now: float) -> list[int]:
        """The agent no longer names the share (its reservation left this GPU): drops it and its
        processes; returns their client IDs (their connections are to be closed)."""
        share = self.shares.pop(share_id, None)
        if share is None:
            return []
        gone = [c.client_id for c in self.clients.values() if c.share is share]
        for client_id in gone:
            self.remove_client(client_id, now)
        return gone

    def add_client(self, client_id: int, share_id: str, pid: int, now: float) -> Client:
        """A process joins a share the agent defined (KeyError otherwise)."""
        share = self.shares[share_id]
        share.clients += 1
        client = Client(client_id, share, pid)
        self.clients[client_id] = client
        return client

    def remove_client(self, client_id: int, now: float) -> None:
        client = self.clients.pop(client_id, None)
        if client is None:
            return
        if client.holding:
            # it died holding the token: charge what it held, at most its quantum
            client.share.charge(min(now - client.granted_at, client.quota_s), now)
            self.holder = None
        client.share.clients -= 1

    # ---- reports ----

    def _report(self, client: Client, used_s: float, idle: bool, now: float) -> None:
        if client.holding:
            held = now - client.granted_at
            used = min(used_s, held + self.settings.grace_s)  # a token cannot have used more than it was held
            client.share.charge(used, now)
            client.share.adapt_quota(used, idle, self.settings)
            client.holding = False
            self.holder = None
        elif client.revoked_charge_s:
            # a late report of a revoked token: it was charged its quantum, settle the rest
            client.share.charge(max(0.0, used_s - client.revoked_charge_s), now)
            client.share.adapt_quota(used_s, idle, self.settings)
        client.revoked_charge_s = 0.0

    def acquire(self, client_id: int, used_s: float, idle: bool, now: float) -> None:
        client = self.clients[client_id]
        self._report(client, used_s, idle, now)
        if client.waiting_since is None:
            client.waiting_since = now

    def release(self, client_id: int, used_s: float, idle: bool, now: float) -> None:
        client = self.clients[client_id]
        self._report(client, used_s, idle, now)
        client.waiting_since = None

    def draining(self, client_id: int, now: float) -> None:
        """The holder waits for the work it queued: it keeps the token until that is done, within
        ``drain_max_s`` (a holder hung in its drain still loses it then)."""
        client = self.clients[client_id]
        if client.holding:
            client.deadline = max(client.deadline, now + self.settings.drain_max_s)

    def expire_holder(self, now: float) -> Client | None:
        """Takes the token from a holder past its deadline; returns it."""
        client = self.holder
        if client is None or now < client.deadline:
            return None
        client.share.charge(client.quota_s, now)
        client.revoked_charge_s = client.quota_s
        client.holding = False
        self.holder = None
        self.revocations += 1
        return client

    # ---- the decision ----

    def _high_present(self) -> bool:
        return any(s.high_priority and s.clients for s in self.shares.values())

    def _quantum(self, share: ShareAccount, high_present: bool) -> float:
        """The quantum this share would get now, its budget aside."""
        if not share.high_priority and high_present:
            return min(share.quota_s, self.settings.low_quota_s)
        return share.quota_s

    def schedule(self, now: float) -> tuple[Grant | None, float | None]:
        """The next grant, if any, and when to look again."""
        if self.holder is not None:
            return None, self.holder.deadline
        settings = self.settings
        high_present = self._high_present()
        best: Client | None = None
        best_key: tuple[int, bool, float, float] | None = None
        wake: float | None = None
        for client in self.clients.values():
            if client.waiting_since is None:
                continue
            share = client.share
            budget = share.budget(now, settings)
            if budget < settings.min_quota_s:
                at = share.eligible_at(now, settings.min_quota_s, settings)
                wake = at if wake is None else min(wake, at)
                continue
            weff = share.effective_window(now, settings)
            # A share whose budget holds only a sliver of its quantum waits for a whole one while another
            # can run: each grant costs a hand-off of idle GPU. (Half the window's allowance counts as
            # whole, or a small share would never have one.)
            whole = min(self._quantum(share, high_present), share.gpu_limit * weff / 2)
            below_request = share.window_used(now, settings.window_s) / (share.gpu_request * weff)
            key = (0 if share.high_priority else 1, budget < whole, below_request, client.waiting_since)
            if best_key is None or key < best_key:
                best, best_key = client, key
        if best is None:
            return None, wake
        share = best.share
        quota = max(settings.min_quota_s, min(self._quantum(share, high_present), share.budget(now, settings)))
        best.holding = True
        best.waiting_since = None
        best.granted_at = now
        best.quota_s = quota
        best.deadline = now + quota + settings.grace_s + quota / 2
        self.holder = best
        return Grant(best.client_id, quota), best.deadline

    # ---- telemetry ----

    def snapshot(self, now: float) -> dict[str, dict[str, object]]:
        return {
            share.share_id: {
                "request": share.gpu_request,
                "limit": share.gpu_limit,
                "priority": "high" if share.high_priority else "low",
                "clients": share.clients,
                "used_total_s": round(share.used_total_s, 6),
                "window_used_s": round(share.window_used(now, self.settings.window_s), 6),
                "window_s": round(share.effective_window(now, self.settings), 3),
                "quota_ms": round(share.quota_s * 1e3, 3),
            }
            for share in self.shares.values()
        }
