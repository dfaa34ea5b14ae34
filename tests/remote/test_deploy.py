"""The remote server runs in the node DaemonSet as the portal expects: on the port the portal's
share tokens send clients to, with this node's own secret from the Secret the portal reads too,
with flags the server accepts, from the agent image (deploy/agent/node-plugins.yaml)."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import yaml

from scheduler.backends.base import REMOTE_SERVER_PORT

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy" / "agent" / "node-plugins.yaml"


def _node_daemonset() -> dict:
    [ds] = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d and d["kind"] == "DaemonSet"]
    return ds


def test_the_remote_server_runs_in_the_node_daemonset_with_its_own_nodes_secret():
    ds = _node_daemonset()
    kubernetes_validate.validate(ds, "1.34.0", strict=True)
    spec = ds["spec"]["template"]["spec"]
    [server] = [c for c in spec["containers"] if c["name"] == "remote-server"]
    args = dict(zip(server["args"][::2], server["args"][1::2], strict=True))
    # Only flags the server parses (preload/remote/server.c), each with a value.
    known = set(re.findall(r'!strcmp\(k, "(--[a-z-]+)"\)', (ROOT / "preload/remote/server.c").read_text()))
    assert set(args) <= known and {"--listen", "--secret-file", "--worker"} <= set(args)
    assert args["--listen"] == f"0.0.0.0:{REMOTE_SERVER_PORT}"
    assert [p["hostPort"] for p in server["ports"]] == [REMOTE_SERVER_PORT]  # the node's address:7470
    mount = next(m for m in server["volumeMounts"] if m["name"] == "remote-secrets")
    assert args["--secret-file"] == f"{mount['mountPath']}/$(NODE_NAME)"
    env = {e["name"]: e for e in server["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    [volume] = [v for v in spec["volumes"] if v["name"] == "remote-secrets"]
    assert volume["secret"]["secretName"] == "tessera-remote-secrets"
    # The workers talk to this node's broker like local shares do.
    assert env["TESSERA_BROKER_SOCKET"]["value"] == "/run/tessera/broker.sock"
    assert {"name": "broker", "mountPath": "/run/tessera", "readOnly": True} in server["volumeMounts"]
    assert server["securityContext"]["allowPrivilegeEscalation"] is False


def test_the_remote_server_serves_the_nodes_gpus_each_pinned_and_counts_shares_in_its_own_budget_dir():
    spec = _node_daemonset()["spec"]["template"]["spec"]
    [server] = [c for c in spec["containers"] if c["name"] == "remote-server"]
    args = dict(zip(server["args"][::2], server["args"][1::2], strict=True))
    mounts = {m["name"]: m for m in server["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    # The GPU list is written before the server starts, by the init step that asks NVML, into a
    # volume the server reads (and cannot change).
    [init] = [c for c in spec["initContainers"] if c["name"] == "remote-gpus"]
    assert init["command"] == ["python", "-m", "agents.remote.gpus", args["--gpu-file"]]
    [init_mount] = init["volumeMounts"]
    assert args["--gpu-file"].startswith(init_mount["mountPath"] + "/")
    assert mounts[init_mount["name"]]["mountPath"] == init_mount["mountPath"]
    assert mounts[init_mount["name"]]["readOnly"] is True
    assert "emptyDir" in volumes[init_mount["name"]]
    assert {e["name"]: e["value"] for e in init["env"]}["NVIDIA_VISIBLE_DEVICES"] == "all"
    # Budget files in their own writable volume, not the container's small /dev/shm.
    [budgets] = [m for m in server["volumeMounts"] if m["mountPath"] == args["--budget-dir"]]
    assert "emptyDir" in volumes[budgets["name"]] and not budgets.get("readOnly")
    # Unauthenticated connections are capped apart from the clients' slots.
    assert int(args["--max-unauthenticated-per-address"]) < int(args["--max-unauthenticated"])


def test_the_agent_image_holds_the_server_and_worker_the_manifest_runs():
    dockerfile = (ROOT / "Dockerfile").read_text()
    containers = _node_daemonset()["spec"]["template"]["spec"]["containers"]
    server = next(c for c in containers if c["name"] == "remote-server")
    assert server["command"] == ["/usr/lib/tessera/remote/tessera-remote-server"]
    assert "COPY preload/remote preload/remote" in dockerfile  # `make -C preload` builds remote/ too
    assert re.search(r"COPY --from=preload /src/preload/build/remote/tessera-remote-server "
                     r"/src/preload/build/remote/tessera-remote-worker \\\s+/usr/lib/tessera/remote/", dockerfile)


def test_the_workers_sign_tokens_with_the_same_secrets_the_servers_check():
    config = next(d for d in yaml.safe_load_all((ROOT / "deploy/portal/config.yaml").read_text()) if d)["data"]
    [workers] = [d for d in yaml.safe_load_all((ROOT / "deploy/portal/workers.yaml").read_text()) if d]
    kubernetes_validate.validate(workers, "1.34.0", strict=True)
    spec = workers["spec"]["template"]["spec"]
    [volume] = [v for v in spec["volumes"] if v["name"] == "remote-secrets"]
    server_volume = next(v for v in _node_daemonset()["spec"]["template"]["spec"]["volumes"]
                         if v["name"] == "remote-secrets")
    assert volume["secret"]["secretName"] == server_volume["secret"]["secretName"]
    [mount] = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "remote-secrets"]
    assert mount["mountPath"] == config["TESSERA_REMOTE_SECRETS_DIR"]


def test_the_agent_writes_the_revoked_share_file_the_server_reads_through_a_host_directory_no_workload_mounts():
    from agents.__main__ import build_parser

    node_pod = _node_daemonset()["spec"]["template"]["spec"]
    [server] = [c for c in node_pod["containers"] if c["name"] == "remote-server"]
    server_file = dict(zip(server["args"][::2], server["args"][1::2], strict=True))["--revoked-file"]
    [agent_ds] = [d for d in yaml.safe_load_all((ROOT / "deploy/agent/daemonset.yaml").read_text())
                  if d and d["kind"] == "DaemonSet" and d["metadata"]["name"] == "tessera-agent"]
    agent_pod = agent_ds["spec"]["template"]["spec"]
    [agent] = agent_pod["containers"]
    agent_file = str(build_parser().parse_args([a.replace("$(NODE_NAME)", "n1") for a in agent["args"]]).revoked_file)

    def host_path(pod, container, file):
        [mount] = [m for m in container["volumeMounts"] if file.startswith(m["mountPath"] + "/")]
        [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        return volume["hostPath"]["path"] + file.removeprefix(mount["mountPath"]), mount

    on_host, server_mount = host_path(node_pod, server, server_file)
    assert host_path(agent_pod, agent, agent_file)[0] == on_host  # the same file on the node
    assert server_mount["readOnly"] is True  # the server cannot clear its own list
    # Workloads get the broker directory (/run/tessera); the list lives outside it.
    broker = next(v for v in node_pod["volumes"] if v["name"] == "broker")["hostPath"]["path"]
    assert not on_host.startswith(broker + "/")
    # The agent (the image's uid 10001) owns the directory, so it can replace the file by rename.
    [init] = agent_pod["initContainers"]
    assert "os.chown('/run/tessera-revoked', 10001, 10001)" in init["command"][-1]
    assert any(m["mountPath"] == "/run/tessera-revoked" for m in init["volumeMounts"])
