"""The local backend's terminal: a real shell on a real PTY, run by this process, in the simulated
pod's working directory with the pod's environment (what `make_pod_spec` gave it, so
`echo $TESSERA_GPU_REQUEST` answers the share), and nothing of this process's own environment
(the portal's database URL and secrets stay out). The shell runs as this process's own OS user, on
this machine: the local backend is for the quickstart, the demo and the tests, not for a cluster
people share.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import shutil
import signal
import struct
import subprocess
import termios
import threading
from collections.abc import Mapping
from pathlib import Path

from .base import PRELOAD_PATH

SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def shell_command() -> list[str]:
    bash = shutil.which("bash", path=SEARCH_PATH)
    return [bash, "--noprofile", "--norc", "-i"] if bash else ["/bin/sh", "-i"]


def shell_env(pod_env: Mapping[str, str], workdir: Path) -> dict[str, str]:
    """The pod's variables over a minimal base. LD_PRELOAD names the node's preload library; where
    this machine has none (a quickstart without preload/ built) the loader would complain at every
    command, so it is left out."""
    env = {"PATH": SEARCH_PATH, "HOME": str(workdir), "TERM": "xterm-256color", "LANG": "C.UTF-8",
           "PS1": r"\w \$ "}
    env.update(pod_env)
    if env.get("LD_PRELOAD") == PRELOAD_PATH and not os.path.exists(PRELOAD_PATH):
        del env["LD_PRELOAD"]
    return env


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class PtyTerminal:
    """One shell on one PTY (the `scheduler.backends.base.Terminal` contract)."""

    def __init__(self, env: Mapping[str, str], workdir: Path, rows: int, cols: int) -> None:
        master, slave = os.openpty()
        try:
            set_size(slave, rows, cols)
            # Its own session with the PTY as controlling terminal: job control and Ctrl-C work,
            # and the whole process group can be ended at close.
            self.proc = subprocess.Popen(shell_command(), stdin=slave, stdout=slave, stderr=slave, cwd=workdir,
                                         env=dict(env), start_new_session=True, close_fds=True,
                                         preexec_fn=_take_terminal)
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        self._fd = master
        self._read_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._ended = False

    def read(self, max_bytes: int, timeout_s: float) -> bytes | None:
        with self._read_lock:
            if self._ended:
                return b""
            ready, _, _ = select.select([self._fd], [], [], timeout_s)
            if not ready:
                return None
            try:
                data = os.read(self._fd, max_bytes)
            except BlockingIOError:
                return None
            except OSError as exc:  # EIO: every writer of the PTY is gone (the shell exited)
                if exc.errno not in (errno.EIO, errno.EBADF):
                    raise
                data = b""
            if not data:
                self._ended = True
            return data

    def write(self, data: bytes) -> None:
        with self._write_lock:
            view = memoryview(data)
            while view and not self._ended:
                try:
                    sent = os.write(self._fd, view)
                except BlockingIOError:  # the shell is not reading: wait for room, then go on
                    select.select([], [self._fd], [], 1.0)
                    continue
                except OSError:
                    return
                view = view[sent:]

    def resize(self, rows: int, cols: int) -> None:
        with self._write_lock:
            if not self._ended:
                set_size(self._fd, rows, cols)
                # Ours is the session leader's terminal: tell its foreground job as a kernel would.
                with contextlib.suppress(OSError):
                    os.killpg(os.tcgetpgrp(self._fd), signal.SIGWINCH)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGHUP)
        try:
            self.proc.wait(2)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        # Both locks: no read or write is using the descriptor when it is closed (a read waits at
        # most its timeout).
        with self._write_lock, self._read_lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            self._ended = True


def _take_terminal() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
