"""What the device plugin gives a container: the placement the scheduler wrote on the pod (its
annotation, read and validated by wire/pod_placement.py) turned into the container's environment
(the variables wire/pod_placement.py defines for both sides) and mounts."""

from __future__ import annotations

from dataclasses import dataclass

from wire.pod_placement import PodPlacement

from . import api_pb2

RESERVATION_LABEL = "tessera.io/reservation"


@dataclass(frozen=True)
class NodePaths:
    """Where the node keeps the preload library and the broker socket (same path in the container)."""

    preload_dir: str = "/opt/tessera/lib"
    preload_library: str = "libtessera_preload.so"
    # beside the library, one line naming it: mounted as the container's /etc/ld.so.preload
    preload_list: str = "ld.so.preload"
    broker_dir: str = "/run/tessera"
    broker_socket: str = "broker.sock"


# The dynamic loader reads this file in every process it starts, whatever the environment says.
LD_SO_PRELOAD = "/etc/ld.so.preload"


# The device nodes a CUDA process opens besides its GPUs' own (/dev/nvidia<minor>).
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def device_specs(minors: list[int]) -> list[api_pb2.DeviceSpec]:
    """The GPUs' device nodes for the container, for nodes whose runtime does not add them itself
    (no NVIDIA container runtime reading NVIDIA_VISIBLE_DEVICES): `--pass-device-specs`."""
    return [api_pb2.DeviceSpec(container_path=path, host_path=path, permissions="rw")
            for path in (*(f"/dev/nvidia{m}" for m in minors), *CONTROL_DEVICES)]


def container_response(placement: PodPlacement, paths: NodePaths,
                       minors: list[int] | None = None) -> api_pb2.ContainerAllocateResponse:
    """Env, mounts (and with `minors`, the GPUs' device nodes) for one container of the placed pod
    (see preload/README.md for the variables): the library both in LD_PRELOAD and in the container's
    /etc/ld.so.preload, the broker's socket directory read-only."""
    envs = placement.env(preload=f"{paths.preload_dir}/{paths.preload_library}",
                         broker_socket=f"{paths.broker_dir}/{paths.broker_socket}")
    mounts = [
        api_pb2.Mount(container_path=paths.preload_dir, host_path=paths.preload_dir, read_only=True),
        # LD_PRELOAD is the container's to unset; /etc/ld.so.preload, a read-only bind mount, is not
        # (preload/README.md says what still gets around it)
        api_pb2.Mount(container_path=LD_SO_PRELOAD, host_path=f"{paths.preload_dir}/{paths.preload_list}",
                      read_only=True),
        # read-only: a workload connects to the socket (connect needs no write access to the mount)
        # but can neither replace it nor plant another in the directory
        api_pb2.Mount(container_path=paths.broker_dir, host_path=paths.broker_dir, read_only=True),
    ]
    return api_pb2.ContainerAllocateResponse(envs=envs, mounts=mounts,
                                             devices=device_specs(minors) if minors is not None else [])
