"""`ws/terminal/<reservation id>/`: a shell in the pod of one of the user's own running
reservations.

Refused at the handshake (403, as for a reservation that does not exist) for anybody but the
owner: another member of the team, another team, a site admin. The owner is accepted and told why
when there is no shell to give: not running, too many terminals open, the cluster refused.

Frames. Browser → portal: binary frames are keystrokes (at most MAX_INPUT_BYTES each; a larger one
closes the socket with 1009), text frames are {"type": "resize", "rows": r, "cols": c}.
Portal → browser: binary frames are the shell's output (at most OUTPUT_CHUNK_BYTES each, at most
OUTPUT_BYTES_PER_S on average: beyond it the shell is not read, so it waits), text frames are
{"type": "ready" | "closed" | "error", "message": …}. The terminal closes when the shell exits,
after IDLE_S without input, when the reservation stops running (its live group's message, and a
look every CHECK_S), or when the session ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from portal.reservations import services
from portal.reservations.models import Reservation
from portal.reservations.states import State
from portal.telemetry import live
from scheduler.backends.base import BackendError, PodRef
from wire.rate import TokenBucket

from . import slots
from .limits import OutputPace, limit

log = logging.getLogger(__name__)

CLOSE_SHELL_EXITED = 1000
CLOSE_TOO_BIG = 1009
CLOSE_BAD_FRAME = 4400
CLOSE_SIGNED_OUT = 4401
CLOSE_IDLE = 4408
CLOSE_NOT_RUNNING = 4409
CLOSE_ENDED = 4410
CLOSE_TOO_MANY = 4429
CLOSE_UNAVAILABLE = 4503
QUEUED_CHUNKS = 4  # output read from the shell and not yet sent: at most this many chunks


@dataclass(frozen=True)
class Target:
    reservation_id: int
    state: str
    pod: PodRef | None


def find_target(user, reservation_id: int) -> Target | None:
    """The user's own reservation; None for anybody else's and for one that does not exist, alike."""
    row = (Reservation.objects.filter(pk=reservation_id, owner_id=user.pk)
           .values_list("state", "pod_namespace", "pod_name").first())
    if row is None:
        return None
    state, namespace, name = row
    return Target(reservation_id, state, PodRef(namespace, name) if namespace and name else None)


def state_label(state: str) -> str:
    return State(state).label.lower()


def _size(query: bytes) -> tuple[int, int]:
    """The first size from the query string (?rows=&cols=), within bounds; 24 × 80 otherwise."""
    values = parse_qs(query.decode("latin-1"))

    def read(name: str, default: int, most: int) -> int:
        try:
            return min(max(int(values.get(name, [default])[0]), 1), most)
        except ValueError:
            return default

    return read("rows", 24, limit("MAX_ROWS")), read("cols", 80, limit("MAX_COLS"))


class TerminalConsumer(AsyncWebsocketConsumer):
    async def __call__(self, scope, receive, send):
        # Whatever way the connection ends, the shell, its slot and its threads end with it.
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._release()

    async def connect(self) -> None:
        self.user = self.scope.get("user")
        self.reservation_id = int(self.scope["url_route"]["kwargs"]["reservation_id"])
        self.terminal = None
        self.slot = None
        self.tasks: list[asyncio.Task] = []
        self.stopping = threading.Event()
        self.released = False
        self.writer: ThreadPoolExecutor | None = None
        self.group = live.Group("reservation", self.reservation_id)
        if self.user is None or not self.user.is_authenticated:
            await self.close()
            return
        target = await database_sync_to_async(find_target)(self.user, self.reservation_id)
        if target is None:
            await self.close()  # refused at the handshake, as if there were no such reservation
            return
        self.target = target
        await self.accept()
        if target.state != State.RUNNING or target.pod is None:
            await self._finish("error", f"Reservation {self.reservation_id} is {state_label(target.state)}: a "
                               "terminal opens once it is running.", CLOSE_NOT_RUNNING)
            return
        per_user = limit("PER_USER")
        self.slot = await sync_to_async(slots.claim, thread_sensitive=False)(self.user.pk, per_user)
        if self.slot is None:
            await self._finish("error", f"You have {per_user} terminal{'s' if per_user != 1 else ''} open "
                               "already; close one to open another.", CLOSE_TOO_MANY)
            return
        rows, cols = _size(self.scope.get("query_string", b""))
        loop = asyncio.get_running_loop()
        try:
            backend = await database_sync_to_async(_backend)()
            self.terminal = await loop.run_in_executor(None, backend.open_terminal, target.pod, rows, cols)
        except BackendError as exc:
            await self._finish("error", f"The terminal could not be opened: {exc}", CLOSE_UNAVAILABLE)
            return
        await database_sync_to_async(services.note_terminal_opened)(self.reservation_id, self.user)
        self.writer = ThreadPoolExecutor(1, thread_name_prefix=f"terminal-{self.reservation_id}")
        self.bucket = TokenBucket(float(limit("INPUT_MESSAGES_PER_S")), int(limit("INPUT_BURST")))
        self.last_input = time.monotonic()
        await self.channel_layer.group_add(self.group.channel_group, self.channel_name)
        await live.store().watch([self.group.name])
        output: asyncio.Queue[bytes] = asyncio.Queue(QUEUED_CHUNKS)
        threading.Thread(target=self._read, args=(self.terminal, output, loop, limit("OUTPUT_CHUNK_BYTES")),
                         name=f"terminal-{self.reservation_id}-read", daemon=True).start()
        self.tasks = [loop.create_task(self._pump(output)), loop.create_task(self._keep())]
        await self._say("ready", f"Connected to {target.pod.name}.")

    # -- input ----------------------------------------------------------------------------------

    async def receive(self, text_data=None, bytes_data=None) -> None:
        if self.terminal is None or self.released:
            return
        most = limit("MAX_INPUT_BYTES")
        size = len(bytes_data) if bytes_data is not None else len((text_data or "").encode())
        if size > most:
            await self._finish("error", f"Input is limited to {most // 1024} KiB at once; paste less at a time.",
                               CLOSE_TOO_BIG)
            return
        if not self.bucket.take():
            await self._finish("error", "Too many messages at once; the terminal is closed.", CLOSE_TOO_MANY)
            return
        loop = asyncio.get_running_loop()
        if bytes_data is not None:
            self.last_input = time.monotonic()
            # One writer thread: keystrokes stay in order, and a shell that reads nothing holds this
            # socket's input back instead of piling it up here.
            await loop.run_in_executor(self.writer, self.terminal.write, bytes_data)
            return
        size = _resize(text_data)
        if size is None:
            await self._say("error", 'Send keystrokes as binary frames and {"type": "resize", "rows": 1–'
                            f'{limit("MAX_ROWS")}, "cols": 1–{limit("MAX_COLS")}}} as text.')
            return
        await loop.run_in_executor(self.writer, self.terminal.resize, *size)

    # -- output ---------------------------------------------------------------------------------

    def _read(self, terminal, output: asyncio.Queue, loop, chunk: int) -> None:
        """The shell's output into `output`, in this thread. While the queue is full nothing is read,
        so the shell blocks on its next write: that is the backpressure."""
        while not self.stopping.is_set():
            try:
                data = terminal.read(chunk, 0.5)
            except Exception:
                log.exception("terminal of reservation %s: reading failed", self.reservation_id)
                data = b""
            if data is None:
                continue
            put = asyncio.run_coroutine_threadsafe(output.put(data), loop)
            while True:
                try:
                    put.result(timeout=0.5)
                    break
                except TimeoutError:
                    if self.stopping.is_set():
                        put.cancel()
                        return
                except Exception:  # the loop is gone
                    return
            if not data:
                return

    async def _pump(self, output: asyncio.Queue) -> None:
        pace = OutputPace(float(limit("OUTPUT_BYTES_PER_S")), int(limit("OUTPUT_BURST_BYTES")))
        while True:
            data = await output.get()
            if not data:
                await self._finish("closed", "The shell exited.", CLOSE_SHELL_EXITED)
                return
            await self.send(bytes_data=data)
            wait = pace.delay(len(data))
            if wait:
                await asyncio.sleep(wait)  # holds the queue full, and so the reading thread

    # -- the end --------------------------------------------------------------------------------

    async def live_message(self, event) -> None:
        """The reservation changed (its live group): perhaps it ended."""
        if not self.released:
            await self._check()

    async def _keep(self) -> None:
        every = float(limit("CHECK_S"))
        idle = float(limit("IDLE_S"))
        while True:
            await asyncio.sleep(every)
            if time.monotonic() - self.last_input > idle:
                await self._finish("closed", f"Closed after {idle / 60:g} min without input.", CLOSE_IDLE)
                return
            if await self._check():
                return
            await sync_to_async(slots.renew, thread_sensitive=False)(self.slot)
            await live.store().watch([self.group.name])

    async def _check(self) -> bool:
        """Close the terminal if its reservation no longer runs in the same pod, or the session ended."""
        why = await database_sync_to_async(self._why_end)()
        if why is None:
            return False
        await self._finish("closed", *why)
        return True

    def _why_end(self) -> tuple[str, int] | None:
        from portal.telemetry.consumers.browser import LiveConsumer

        now = find_target(self.user, self.reservation_id)
        if now is None or now.state != State.RUNNING or now.pod != self.target.pod:
            state = state_label(now.state) if now is not None else "gone"
            return f"Reservation {self.reservation_id} is {state}: the terminal is closed.", CLOSE_ENDED
        # The live socket's own check that the session still names this active user.
        if not LiveConsumer.still_signed_in(self):
            return "Your session ended; sign in again.", CLOSE_SIGNED_OUT
        return None

    async def _say(self, kind: str, message: str) -> None:
        await self.send(text_data=json.dumps({"type": kind, "message": message}, separators=(",", ":")))

    async def _finish(self, kind: str, message: str, code: int) -> None:
        if self.released:
            return
        await self._release()
        try:
            await self._say(kind, message)
            await self.close(code)
        except Exception:  # the client is gone already
            log.debug("terminal of reservation %s: closing a gone socket", self.reservation_id, exc_info=True)

    async def _release(self) -> None:
        """End the shell and free its slot, threads and group; once, whichever way comes first."""
        if getattr(self, "released", True):
            return
        self.released = True
        self.stopping.set()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()
        loop = asyncio.get_running_loop()
        if self.terminal is not None:
            await loop.run_in_executor(None, self.terminal.close)
        if self.writer is not None:
            self.writer.shutdown(wait=False)
        if self.slot is not None:
            await sync_to_async(slots.release, thread_sensitive=False)(self.slot)
        try:
            await self.channel_layer.group_discard(self.group.channel_group, self.channel_name)
        except Exception:
            log.debug("terminal of reservation %s: leaving its group failed", self.reservation_id, exc_info=True)


def _backend():
    from portal.placement.backend import get_backend

    return get_backend()


def _resize(text: str | None) -> tuple[int, int] | None:
    try:
        body = json.loads(text or "")
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict) or body.get("type") != "resize":
        return None
    rows, cols = body.get("rows"), body.get("cols")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (rows, cols)):
        return None
    if not (1 <= rows <= limit("MAX_ROWS") and 1 <= cols <= limit("MAX_COLS")):
        return None
    return rows, cols
