"""A remote GPU share's pod on Kubernetes: it runs on a node without the GPU (no device plugin
there), so it asks for no share slot and no NVIDIA runtime; an init container copies the client
libraries from the agent image into an emptyDir (no hostPath: PodSecurity baseline admits it), and
its env names the GPU node's server and carries the share token."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from scheduler.backends import GpuShare, make_pod_spec
from scheduler.backends.base import REMOTE_CLIENT_DIR, remote_share_env
from scheduler.backends.kubernetes.manifests import CLIENT_IMAGE_DIR, SHARE_RESOURCE

ROOT = Path(__file__).resolve().parents[3]
NAMESPACE = "tessera-workloads"
GPU = GpuShare(uuid="GPU-0a1b2c3d-0000-4000-8000-000000000001", index=0, gpu_request=0.25, gpu_limit=0.5,
               gpu_memory_mib=8192)


def remote_spec(node="cpu-node-1", **env):
    return make_pod_spec(reservation_id="42", attempt=1, namespace=NAMESPACE, node=node, team="vision",
                         image="ghcr.io/example/train:1.0", command=("python", "train.py"), gpus=(GPU,),
                         priority=10, kind="batch", extra_env={"EPOCHS": "3", **env},
                         remote_env=remote_share_env("42", "10.0.0.11:7470", "tsr1.claims.mac"))


@pytest.fixture
def baseline(apiserver):
    apiserver.add_node("cpu-node-1", address="10.0.0.21")
    apiserver.add_namespace(NAMESPACE, {"pod-security.kubernetes.io/enforce": "baseline"})
    return apiserver


def test_a_remote_shares_pod_gets_the_client_libraries_without_a_share_slot_or_host_path(baseline, backend):
    # A user's own LD_LIBRARY_PATH or server cannot replace ours.
    status = backend.bind(remote_spec(LD_LIBRARY_PATH="/mine", TESSERA_REMOTE_SERVER="evil:1"))
    assert (status.namespace, status.node) == (NAMESPACE, "cpu-node-1")  # PodSecurity baseline admitted it
    (pod,) = baseline.pods()
    spec = pod["spec"]
    (container,) = spec["containers"]
    # Nothing the GPU-less node cannot give: no device-plugin resource, no NVIDIA runtime, no GPU taint.
    assert SHARE_RESOURCE not in str(container.get("resources", {}))
    assert "runtimeClassName" not in spec and "nvidia.com/gpu" not in str(spec.get("tolerations"))
    assert not any("hostPath" in v for v in spec["volumes"])
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {"EPOCHS": "3", "LD_LIBRARY_PATH": REMOTE_CLIENT_DIR, "TESSERA_REMOTE_SERVER": "10.0.0.11:7470",
                   "TESSERA_REMOTE_TOKEN": "tsr1.claims.mac", "TESSERA_SHARE_ID": "42"}
    # The init container fills an emptyDir the workload reads at LD_LIBRARY_PATH.
    (init,) = spec["initContainers"]
    (volume,) = spec["volumes"]
    assert "emptyDir" in volume
    assert {"name": volume["name"], "mountPath": REMOTE_CLIENT_DIR, "readOnly": True} in container["volumeMounts"]
    assert init["volumeMounts"] == [{"name": volume["name"], "mountPath": REMOTE_CLIENT_DIR}]
    assert init["image"] == "tessera/agent:0.1.0" and init["command"][-1] == REMOTE_CLIENT_DIR
    security = init["securityContext"]
    assert security["runAsNonRoot"] and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]} and security["readOnlyRootFilesystem"]
    assert baseline.validated >= 1 and not baseline.invalid  # kubernetes-validate, strict


def test_a_local_shares_pod_is_unchanged_it_asks_the_device_plugin(baseline, nodes, backend, pod_spec):
    backend.bind(pod_spec(namespace=NAMESPACE))
    (pod,) = baseline.pods()
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {SHARE_RESOURCE: "1"}
    assert "initContainers" not in pod["spec"] and "volumes" not in pod["spec"]


def test_the_client_image_is_configurable_and_a_blank_one_is_refused(baseline, make_backend, monkeypatch):
    from scheduler.backends import PermanentBackendError

    monkeypatch.setenv("TESSERA_REMOTE_CLIENT_IMAGE", "registry.example.org/tessera/agent:0.2.0")
    make_backend().bind(remote_spec())
    (pod,) = baseline.pods()
    assert pod["spec"]["initContainers"][0]["image"] == "registry.example.org/tessera/agent:0.2.0"
    with pytest.raises(PermanentBackendError, match="TESSERA_REMOTE_CLIENT_IMAGE"):
        make_backend(client_image=" ").bind(remote_spec())


def test_the_init_containers_copy_gives_the_workload_the_libraries_the_image_holds(baseline, backend, tmp_path):
    """The command, run as it is against the libraries `make -C preload` builds (the Dockerfile
    puts them at CLIENT_IMAGE_DIR), leaves what a CUDA 13 program loads in the workload's directory."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"COPY --from=preload /src/preload/build/remote/client {CLIENT_IMAGE_DIR}" in dockerfile
    if shutil.which("cp") is None:
        pytest.skip("no cp here")
    subprocess.run(["make", "-s", "-C", str(ROOT / "preload"), "remote"], check=True, capture_output=True)
    backend.bind(remote_spec())
    (pod,) = baseline.pods()
    command = pod["spec"]["initContainers"][0]["command"]
    image_dir, workload_dir = ROOT / "preload/build/remote/client", tmp_path / "client"
    workload_dir.mkdir()
    command = [a.replace(CLIENT_IMAGE_DIR, str(image_dir)).replace(REMOTE_CLIENT_DIR, str(workload_dir))
               for a in command]
    subprocess.run(command, check=True)
    assert (workload_dir / "libcuda.so.1").is_file() and (workload_dir / "libcudart.so.13").is_file()
    assert (workload_dir / "libcuda.so").is_symlink()  # a link stays a link
    soname = subprocess.run(["readelf", "-d", str(workload_dir / "libcudart.so.13")], capture_output=True,
                            text=True).stdout
    assert re.search(r"Library soname: \[libcudart\.so\.13\]", soname)


def test_nodes_report_the_internal_ip_pods_reach_them_by(apiserver, backend):
    apiserver.add_node("gpu-node-1", address="10.0.0.11")
    apiserver.add_node("gpu-node-2")  # reports no address
    assert {n.name: n.address for n in backend.list_nodes()} == {"gpu-node-1": "10.0.0.11", "gpu-node-2": ""}
