"""Dynamic Resource Allocation (`resource.k8s.io/v1`): the node's GPUs as a ResourceSlice
(`slices.py`) and the kubelet DRA plugin that prepares claims as CDI specs (`plugin.py`).
See agents/dra/README.md."""
