"""A prepared claim as a CDI spec (Container Device Interface, cdiVersion 0.6.0): what the container
runtime adds to each container that uses the claim.

One spec file per claim, `<cdi dir>/gpu.tessera.io-share_<claim uid>.json`, kind
`gpu.tessera.io/share`, one device named by the claim's uid, so the kubelet is answered the CDI id
`gpu.tessera.io/share=<uid>`. Its container edits:

- the GPUs' device nodes `/dev/nvidia<index>` and the control nodes `/dev/nvidiactl`,
  `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools` (the device plugin's `CONTROL_DEVICES`);
- the share's variables, from the same builder the Kubernetes backend and the device plugin use
  (`scheduler.backends.base.share_env`): NVIDIA_VISIBLE_DEVICES, LD_PRELOAD, TESSERA_GPU_REQUEST,
  TESSERA_GPU_LIMIT, TESSERA_GPU_MEMORY_LIMIT, TESSERA_PRIORITY, TESSERA_SHARE_ID,
  TESSERA_BROKER_SOCKET;
- the preload library's directory, `/etc/ld.so.preload` naming the library, and the broker's
  socket directory, bind-mounted read-only, as the device plugin mounts them.

Files are written atomically (a temporary file in the same directory, fsync, rename), so a runtime
never reads half a spec.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agents.deviceplugin.placement import CONTROL_DEVICES, LD_SO_PRELOAD, NodePaths
from scheduler.backends.base import BROKER_HOST_DIR, PRELOAD_HOST_DIR, GpuShare, share_env

CDI_VERSION = "0.6.0"
VENDOR = "gpu.tessera.io"
CLASS = "share"
KIND = f"{VENDOR}/{CLASS}"
CDI_DIR = "/var/run/cdi"


def cdi_id(claim_uid: str) -> str:
    return f"{KIND}={claim_uid}"


def spec_path(cdi_dir: str | Path, claim_uid: str) -> Path:
    return Path(cdi_dir) / f"{VENDOR}-{CLASS}_{claim_uid}.json"


def claim_spec(claim_uid: str, share_id: str, gpus: Sequence[GpuShare], priority: int) -> dict[str, Any]:
    """The CDI spec of one prepared claim (`gpus`: its GPUs, each with the share of it)."""
    env = share_env(share_id, tuple(gpus), priority)
    nodes = [*(f"/dev/nvidia{g.index}" for g in gpus), *CONTROL_DEVICES]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": [{
            "name": claim_uid,
            "containerEdits": {
                "env": [f"{k}={v}" for k, v in sorted(env.items())],
                "deviceNodes": [{"path": p} for p in nodes],
                # As the device plugin mounts them (agents/deviceplugin/placement.py): all read-only.
                "mounts": [
                    {"hostPath": PRELOAD_HOST_DIR, "containerPath": PRELOAD_HOST_DIR,
                     "options": ["ro", "nosuid", "nodev", "bind"]},
                    # LD_PRELOAD is the container's to unset; /etc/ld.so.preload, read-only, is not
                    {"hostPath": f"{PRELOAD_HOST_DIR}/{NodePaths.preload_list}", "containerPath": LD_SO_PRELOAD,
                     "options": ["ro", "nosuid", "nodev", "bind"]},
                    # a workload connects to the socket but can neither replace it nor plant another
                    {"hostPath": BROKER_HOST_DIR, "containerPath": BROKER_HOST_DIR,
                     "options": ["ro", "nosuid", "nodev", "bind"]},
                ],
            },
        }],
    }


def write_atomically(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
