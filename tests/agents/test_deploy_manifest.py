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


def test_the_broker_takes_terms_only_from_the_agent_on_a_socket_no_workload_mounts():
    from agents.broker.__main__ import build_parser as broker_parser
    from agents.deviceplugin.__main__ import build_parser as plugin_parser

    nodes = [d for d in yaml.safe_load_all(MANIFEST.with_name("node-plugins.yaml").read_text())
             if d and d["kind"] == "DaemonSet"]
    (node_pod,) = [d["spec"]["template"]["spec"] for d in nodes]
    assert node_pod["hostPID"] is True  # the broker sees a workload's pid, and its cgroup
    containers = {c["name"]: c for c in node_pod["containers"]}
    broker = broker_parser().parse_args(containers["broker"]["command"][3:] + containers["broker"]["args"])
    assert broker.identity == "cgroup" and broker.trust_own_pod and broker.agent_uid == [10001]
    control_dir = str(Path(broker.control_socket).parent)
    agent = daemonset("tessera-agent")["spec"]["template"]["spec"]
    (agent_container,) = agent["containers"]
    parsed = build_parser().parse_args([a.replace("$(NODE_NAME)", "n") for a in agent_container["args"]])
    assert str(parsed.broker_socket) == broker.control_socket
    assert control_dir in {m["mountPath"] for m in agent_container["volumeMounts"]}
    # the workloads' directory is another one, and reaches them (and the remote server) read-only
    plugin = plugin_parser().parse_args([a.replace("$(NODE_NAME)", "n") for a in containers["device-plugin"]["args"]])
    assert str(Path(broker.socket).parent) == plugin.broker_dir != control_dir
    server_mount = next(m for m in containers["remote-server"]["volumeMounts"] if m["name"] == "broker")
    assert server_mount["readOnly"] is True
    control_volumes = {v["name"] for v in node_pod["volumes"] if v.get("hostPath", {}).get("path") == control_dir}
    for name, container in containers.items():
        if name != "broker":
            assert not control_volumes & {m["name"] for m in container["volumeMounts"]}, name
    # the file the device plugin mounts as /etc/ld.so.preload is written beside the library
    install = next(c for c in node_pod["initContainers"] if c["name"] == "install-preload")
    assert f"/host/lib/{'ld.so.preload'}" in install["command"][-1]
    assert f"echo {plugin.preload_dir}/libtessera_preload.so" in install["command"][-1]
