"""The local backend's real apps: a simulated pod whose environment declares Jupyter
(TESSERA_APP=jupyter, set by the portal: portal.connect.access.app_env) runs a real
`jupyter-server` as a local process, so the quickstart and the tests open a real notebook through
the portal's proxy.

The server gets the pod's environment (and not the worker's: no database URL or secret key), its
token from the portal (JUPYTER_TOKEN, so it is not on a command line others can read), the
portal's path prefix as its base URL, and listens on 127.0.0.1 on a free port. Its own session
(process group), so stopping it stops its kernels too. Other apps (VS Code server, TensorBoard, a
port) have no local stand-in: their pods simply have no address.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

RUNS = {"jupyter"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(env: Mapping[str, str], workdir: Path) -> tuple[int, int] | None:
    """Start the pod's app; (pid, port), or None when the pod declares none that runs here."""
    if env.get("TESSERA_APP") not in RUNS or not env.get("TESSERA_APP_TOKEN"):
        return None
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    bin_dir = str(Path(sys.executable).parent)
    process_env = {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", "HOME": str(workdir), "LANG": "C.UTF-8",
        **{k: v for k, v in env.items() if k not in ("TESSERA_APP_TOKEN", "JUPYTER_TOKEN")},
        "JUPYTER_TOKEN": env["TESSERA_APP_TOKEN"],
        # its own config, data and runtime files: nothing of the machine's Jupyter set-up leaks in
        "JUPYTER_CONFIG_DIR": str(workdir / ".jupyter"), "JUPYTER_DATA_DIR": str(workdir / ".local"),
        "JUPYTER_RUNTIME_DIR": str(workdir / ".runtime"), "JUPYTER_PLATFORM_DIRS": "1",
    }
    command = [sys.executable, "-m", "jupyter_server", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
               "--ServerApp.port_retries=0", "--ServerApp.open_browser=False",
               f"--ServerApp.base_url={env.get('TESSERA_APP_BASE_URL', '/')}", f"--ServerApp.root_dir={workdir}",
               "--ServerApp.terminals_enabled=False"]
    if os.geteuid() == 0:  # a container's root (the tests' machine): the pod's process runs as it would there
        command.append("--allow-root")
    # A dot file: the notebook's file browser (rooted here, hidden files not shown) lists only the user's files.
    with (workdir / ".app.log").open("ab") as log:
        proc = subprocess.Popen(command, env=process_env, cwd=workdir, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    threading.Thread(target=proc.wait, name=f"reap-app-{proc.pid}", daemon=True).start()  # no zombie left
    return proc.pid, port


def stop(pid: int) -> None:
    """SIGTERM to the app's process group (its kernels with it); gone already is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0
