"""The agent DaemonSet is valid Kubernetes and runs the agent with flags it understands."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import yaml

from agents.__main__ import build_parser

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "agent" / "daemonset.yaml"


def documents() -> list[dict]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def daemonset(name: str) -> dict:
    (found,) = [d for d in documents() if d["kind"] == "DaemonSet" and d["metadata"]["name"] == name]
    return found


def test_the_manifest_is_valid_for_kubernetes_1_34():
    for doc in documents():
        kubernetes_validate.validate(doc, "1.34.0", strict=True)


def test_the_agent_sees_host_processes_and_reads_its_own_nodes_token_without_taking_a_gpu():
    pod = daemonset("tessera-agent")["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    (container,) = pod["containers"]
    assert "nvidia.com/gpu" not in str(container["resources"])
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # Kubernetes expands $(NODE_NAME); the result must be arguments the agent accepts.
    args = [a.replace("$(NODE_NAME)", "gpu-node-1") for a in container["args"]]
    parsed = build_parser().parse_args(args)
    assert str(parsed.token_file) == "/etc/tessera/tokens/gpu-node-1"
    assert parsed.node == "gpu-node-1" and parsed.simulate is None
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert str(parsed.token_file.parent) in mounts


def test_nodes_without_a_gpu_get_an_agent_that_needs_no_nvidia_runtime_and_reads_its_token(tmp_path):
    gpu_pod = daemonset("tessera-agent")["spec"]["template"]["spec"]
    pod = daemonset("tessera-agent-cpu")["spec"]["template"]["spec"]
    # Exactly the nodes the GPU agent leaves out (its nodeSelector), no NVIDIA runtime, no host PIDs.
    [(key, value)] = gpu_pod["nodeSelector"].items()
    [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": key, "operator": "NotIn", "values": [value]}]
    assert "runtimeClassName" not in pod and not pod.get("hostPID") and "tolerations" not in pod
    (container,) = pod["containers"]
    assert not any(e["name"].startswith("NVIDIA") for e in container["env"])
    args = [a.replace("$(NODE_NAME)", "cpu-node-1") for a in container["args"]]
    parsed = build_parser().parse_args(args)
    assert parsed.no_gpus and parsed.node == "cpu-node-1" and parsed.broker_socket is None
    assert parsed.reserved_cpu > 0 and parsed.reserved_memory > 0
    # It runs as a user, so its token must be readable through the pod's group.
    [volume] = [v for v in pod["volumes"] if v["name"] == "tokens"]
    assert volume["secret"]["defaultMode"] & 0o040 and pod["securityContext"]["fsGroup"] == 10001
    assert str(parsed.token_file.parent) in {m["mountPath"] for m in container["volumeMounts"]}
