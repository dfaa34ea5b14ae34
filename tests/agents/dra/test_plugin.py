"""The kubelet DRA plugin driven as a kubelet drives it: registration over the plugins_registry
socket, then NodePrepareResources / NodeUnprepareResources over the plugin's own socket, with claims
read from the fake API server. CDI specs checked as the container runtime will read them."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from pathlib import Path

import grpc
import pytest

from agents.dra import dra_pb2, dra_pb2_grpc, generate, pluginregistration_pb2, pluginregistration_pb2_grpc
from agents.dra.plugin import DraService, KubernetesClaims, PluginRunner
from agents.dra.slices import MIB, SliceApi, SlicePublisher

NODE = "gpu-node-1"
PLACEMENT = '{"gpus":["GPU-00000000-0000-4000-8000-000000000001"],"limit":0.6,"memory_mib":12288,' \
            '"priority":"high","request":0.4,"reservation":"77"}'


class FakeKubelet:
    """The kubelet's side: its plugin watcher (GetInfo on the registration socket, then
    NotifyRegistrationStatus) and its DRA manager (Prepare/Unprepare on the endpoint it was given)."""

    def __init__(self, registry: Path) -> None:
        self.registry = registry
        self.channels: list[grpc.Channel] = []

    def _channel(self, path: str) -> grpc.Channel:
        channel = grpc.insecure_channel(f"unix://{path}")
        self.channels.append(channel)
        return channel

    def register(self) -> dra_pb2_grpc.DRAPluginStub:
        sockets = sorted(self.registry.glob("*.sock"))
        assert [s.name for s in sockets] == ["gpu.tessera.io-reg.sock"]
        registration = pluginregistration_pb2_grpc.RegistrationStub(self._channel(str(sockets[0])))
        info = registration.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=5)
        assert (info.type, info.name, list(info.supported_versions)) == ("DRAPlugin", "gpu.tessera.io",
                                                                         ["v1.DRAPlugin"])
        registration.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(plugin_registered=True),
                                              timeout=5)
        return dra_pb2_grpc.DRAPluginStub(self._channel(info.endpoint))

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


@pytest.fixture
def dirs():
    # Unix socket paths must stay under 108 bytes: pytest's tmp_path can be longer.
    root = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    yield {name: root / name for name in ("plugins", "registry", "cdi", "state")}
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def start_plugin(apiserver, gpus, dirs):
    started = []

    def start() -> PluginRunner:
        service = DraService(NODE, gpus, KubernetesClaims(host=apiserver.url), state_dir=dirs["state"],
                             cdi_dir=dirs["cdi"])
        runner = PluginRunner(service, plugins_dir=dirs["plugins"], registry_dir=dirs["registry"],
                              check_every_s=0.05)
        runner.start()
        threading.Thread(target=runner.run, daemon=True).start()
        started.append(runner)
        return runner

    yield start
    for runner in started:
        runner.stop()


@pytest.fixture
def kubelet(dirs):
    k = FakeKubelet(dirs["registry"])
    yield k
    k.close()


def _allocated_claim(apiserver, gpus, name: str, *, device: str = "gpu-1", compute: str = "400",
                     memory: int = 12 * 1024 * MIB, annotations: dict | None = None) -> dict:
    SlicePublisher(SliceApi(host=apiserver.url), NODE).sync(gpus, "550.54.15", "12.4")
    claim = apiserver.put_object({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team-vision", "annotations": annotations or {}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu-share.tessera.io",
            "capacity": {"requests": {"compute": compute, "memory": str(memory)}}}}]}}})
    claim["status"] = {"allocation": {"devices": {"results": [{
        "request": "gpu", "driver": "gpu.tessera.io", "pool": NODE, "device": device,
        "shareID": "6f1c2a40-0000-4000-8000-000000000001",
        "consumedCapacity": {"compute": compute, "memory": str(memory)}}]}}}
    return apiserver.put_object(claim)


def _claim(obj: dict) -> dra_pb2.Claim:
    meta = obj["metadata"]
    return dra_pb2.Claim(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def _prepare(dra, *claims: dict) -> dra_pb2.NodePrepareResourcesResponse:
    return dra.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=[_claim(c) for c in claims]),
                                    timeout=10)


def _env(spec: dict) -> dict[str, str]:
    return dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])


def test_a_share_claim_becomes_a_cdi_spec_with_the_gpu_the_library_and_the_terms(
        apiserver, gpus, dirs, start_plugin, kubelet):
    claim = _allocated_claim(apiserver, gpus, "train", annotations={"tessera.io/placement": PLACEMENT})
    start_plugin()
    dra = kubelet.register()
    answer = _prepare(dra, claim).claims[claim["metadata"]["uid"]]
    uid = claim["metadata"]["uid"]
    assert answer.error == ""
    assert [(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in answer.devices] == [
        (["gpu"], NODE, "gpu-1", [f"gpu.tessera.io/share={uid}"])]
    spec = json.loads((dirs["cdi"] / f"gpu.tessera.io-share_{uid}.json").read_text())
    assert (spec["cdiVersion"], spec["kind"], spec["devices"][0]["name"]) == ("0.6.0", "gpu.tessera.io/share", uid)
    edits = spec["devices"][0]["containerEdits"]
    assert [n["path"] for n in edits["deviceNodes"]] == [
        "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert _env(spec) == {
        "NVIDIA_VISIBLE_DEVICES": gpus[1].uuid, "LD_PRELOAD": "/opt/tessera/lib/libtessera_preload.so",
        "TESSERA_GPU_REQUEST": "0.4", "TESSERA_GPU_LIMIT": "0.6", "TESSERA_GPU_MEMORY_LIMIT": "12288Mi",
        "TESSERA_PRIORITY": "high", "TESSERA_SHARE_ID": "77", "TESSERA_BROKER_SOCKET": "/run/tessera/broker.sock"}
    assert [(m["hostPath"], m["containerPath"], m["options"][0]) for m in edits["mounts"]] == [
        ("/opt/tessera/lib", "/opt/tessera/lib", "ro"), ("/opt/tessera/lib/ld.so.preload", "/etc/ld.so.preload", "ro"),
        ("/run/tessera", "/run/tessera", "ro")]


def test_a_claim_the_kube_scheduler_allocated_gets_its_own_share_id(apiserver, gpus, dirs, start_plugin, kubelet):
    claim = _allocated_claim(apiserver, gpus, "plain", compute="250", memory=8 * 1024 * MIB)
    start_plugin()
    uid = claim["metadata"]["uid"]
    assert _prepare(kubelet.register(), claim).claims[uid].error == ""
    env = _env(json.loads((dirs["cdi"] / f"gpu.tessera.io-share_{uid}.json").read_text()))
    assert (env["TESSERA_SHARE_ID"], env["TESSERA_GPU_REQUEST"], env["TESSERA_GPU_LIMIT"],
            env["TESSERA_GPU_MEMORY_LIMIT"], env["TESSERA_PRIORITY"]) == (
        f"claim-{uid}", "0.25", "0.25", "8192Mi", "low")


def test_the_placement_is_read_from_the_pod_the_claim_is_reserved_for(apiserver, gpus, dirs, start_plugin, kubelet):
    pod = apiserver.create_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "train-0", "namespace": "team-vision", "annotations": {"tessera.io/placement": PLACEMENT}},
        "spec": {"containers": [{"name": "c", "image": "x"}]}})
    claim = _allocated_claim(apiserver, gpus, "train")
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": "train-0", "uid": pod["metadata"]["uid"]}]
    claim = apiserver.put_object(claim)
    start_plugin()
    uid = claim["metadata"]["uid"]
    assert _prepare(kubelet.register(), claim).claims[uid].error == ""
    env = _env(json.loads((dirs["cdi"] / f"gpu.tessera.io-share_{uid}.json").read_text()))
    assert (env["TESSERA_SHARE_ID"], env["TESSERA_GPU_LIMIT"], env["TESSERA_PRIORITY"]) == ("77", "0.6", "high")


def test_preparing_again_reads_nothing_and_a_restart_keeps_the_claims(apiserver, gpus, dirs, start_plugin, kubelet):
    claim = _allocated_claim(apiserver, gpus, "train")
    uid = claim["metadata"]["uid"]
    first = start_plugin()
    dra = kubelet.register()
    once = _prepare(dra, claim)
    assert _prepare(dra, claim) == once
    assert first.service.api_reads == 1
    first.stop()
    # The plugin restarts; the API server is away meanwhile: the kubelet's retry is answered from the checkpoint.
    second = start_plugin()
    apiserver.inject("GET", r"/resourceclaims/", status=503, times=10)
    (dirs["cdi"] / f"gpu.tessera.io-share_{uid}.json").unlink()  # and the runtime's CDI dir was wiped
    assert _prepare(kubelet.register(), claim) == once
    assert second.service.api_reads == 0
    assert (dirs["cdi"] / f"gpu.tessera.io-share_{uid}.json").exists()


def test_a_claim_that_cannot_be_read_now_is_reported_and_prepared_when_asked_again(
        apiserver, gpus, dirs, start_plugin, kubelet):
    claim = _allocated_claim(apiserver, gpus, "train")
    uid = claim["metadata"]["uid"]
    runner = start_plugin()
    dra = kubelet.register()
    apiserver.inject("GET", r"/resourceclaims/", status=None, delay_s=2.0)  # longer than the client waits
    runner.service.claims.timeout_s = 0.5
    assert "cannot read ResourceClaim team-vision/train" in _prepare(dra, claim).claims[uid].error
    assert _prepare(dra, claim).claims[uid].error == ""


def test_unprepare_deletes_the_spec_and_forgets_the_claim_even_twice(apiserver, gpus, dirs, start_plugin, kubelet):
    claim = _allocated_claim(apiserver, gpus, "train")
    uid = claim["metadata"]["uid"]
    runner = start_plugin()
    dra = kubelet.register()
    _prepare(dra, claim)
    for _ in range(2):
        answer = dra.NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(claims=[_claim(claim)]), timeout=5)
        assert uid in answer.claims and answer.claims[uid].error == ""
    assert not (dirs["cdi"] / f"gpu.tessera.io-share_{uid}.json").exists()
    assert json.loads((dirs["state"] / "checkpoint.json").read_text())["claims"] == {}
    assert runner.service.checkpoint.claims == {}


def test_claims_that_cannot_be_prepared_here_say_why_and_the_others_are_prepared(
        apiserver, gpus, dirs, start_plugin, kubelet):
    good = _allocated_claim(apiserver, gpus, "good")
    elsewhere = _allocated_claim(apiserver, gpus, "elsewhere", device="gpu-2")
    elsewhere["status"]["allocation"]["devices"]["results"][0]["pool"] = "gpu-node-2"
    apiserver.check_allocations = False  # a slice of gpu-node-2 is not what this test is about
    elsewhere = apiserver.put_object(elsewhere)
    pending = apiserver.put_object({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                    "metadata": {"name": "pending", "namespace": "team-vision"},
                                    "spec": {"devices": {"requests": []}}})
    start_plugin()
    answer = _prepare(kubelet.register(), good, elsewhere, pending)
    assert answer.claims[good["metadata"]["uid"]].error == ""
    assert "not of this node (gpu-node-1)" in answer.claims[elsewhere["metadata"]["uid"]].error
    assert "is not allocated" in answer.claims[pending["metadata"]["uid"]].error
    replaced = dra_pb2.Claim(namespace="team-vision", name="good", uid="00000000-0000-4000-8000-0000000000ff")
    answer = kubelet.register().NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=[replaced]))
    assert "deleted and made again" in answer.claims[replaced.uid].error


def test_a_deleted_socket_is_served_again(apiserver, gpus, dirs, start_plugin, kubelet):
    runner = start_plugin()
    runner.registration_socket.unlink()
    _wait(runner.registration_socket.exists)
    kubelet.register()


def test_the_committed_stubs_match_the_protos():
    for name, text in generate.generate().items():
        assert (generate.HERE / name).read_text() == text, f"{name} is stale: python -m agents.dra.generate"


def test_the_services_have_the_kubelets_wire_names():
    assert dra_pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    registration = pluginregistration_pb2.DESCRIPTOR.services_by_name["Registration"]
    assert registration.full_name == "pluginregistration.Registration"


def _wait(predicate, timeout_s: float = 10.0) -> None:
    event = threading.Event()
    for _ in range(int(timeout_s / 0.02)):
        if predicate():
            return
        event.wait(0.02)
    raise AssertionError("timed out")


def test_the_command_line_publishes_a_simulated_node_and_serves_until_sigterm(apiserver, dirs):
    import os
    import signal
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[3]
    apiserver.add_node("t4-node-1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agents.dra", "--node", "t4-node-1", "--simulate",
         str(repo / "deploy" / "inventory" / "demo.yaml"), "--api-server", apiserver.url,
         "--plugins-dir", str(dirs["plugins"]), "--registry-dir", str(dirs["registry"]),
         "--cdi-dir", str(dirs["cdi"])],
        cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        _wait(lambda: apiserver.objects("ResourceSlice") and (dirs["registry"] / "gpu.tessera.io-reg.sock").exists(),
              timeout_s=60)
        (stored,) = apiserver.objects("ResourceSlice")
        assert stored["spec"]["nodeName"] == "t4-node-1" and stored["spec"]["devices"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
