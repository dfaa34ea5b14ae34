"""Tessera's kubelet device plugin (API v1beta1) for the kubectl path.

A pod created with kubectl (`schedulerName: tessera`, KubeShare labels) whose container asks for
`tessera.io/gpu-share: 1` is placed by the portal and bound with the placement in its
`tessera.io/placement` annotation; when the kubelet admits it, `Allocate` finds that pod through the
API server and returns the container's environment (NVIDIA_VISIBLE_DEVICES, LD_PRELOAD, TESSERA_*)
and mounts (the preload library and the share broker's socket directory).

- `api.proto` + generated `api_pb2*.py` (regenerate: ``python -m agents.deviceplugin.generate``)
- `devices.py`: per-GPU share slots as kubelet devices
- `placement.py`: env and mounts from the placement (its annotation's format, validation and the
  variables: wire/pod_placement.py)
- `pods.py`: which pod an Allocate call is for
- `server.py`: the gRPC service, registration, re-registration after a kubelet restart
- `__main__.py`: the command line
"""
