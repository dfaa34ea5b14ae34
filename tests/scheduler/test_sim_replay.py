"""The replay harness on small clusters: shape of the results and the CLI's outputs."""

import json

import pytest

from scheduler.sim.cli import main
from scheduler.sim.replay import arrival_order, replay
from scheduler.sim.trace import DEFAULT_TRACE_DIR, TraceNode, TracePod, load_nodes, load_pods, resolve_trace

NODES = [TraceNode(f"n{i:02d}", 32000, 131072, 4 if i % 2 else 2, "A" if i % 3 else "B") for i in range(12)]
PODS = [
    TracePod("frac", 2000, 4096, 1, 500, ""),
    TracePod("small", 1000, 2048, 1, 250, ""),
    TracePod("whole", 4000, 8192, 1, 1000, ""),
    TracePod("pair", 8000, 16384, 2, 1000, "A"),
    TracePod("cpu", 4000, 4096, 0, 0, ""),
]


def test_arrivals_stop_at_the_ratio():
    import numpy as np

    capacity = sum(n.gpus for n in NODES) * 1000
    order = arrival_order(PODS, capacity, 1.3, np.random.default_rng(1))
    demand = sum(PODS[i].num_gpu * PODS[i].gpu_milli for i in order)
    assert 1.3 * capacity - 2000 <= demand <= 1.3 * capacity
    assert sorted(order[: len(PODS)]) == list(range(len(PODS)))  # every trace pod, shuffled, first


@pytest.mark.parametrize("policy", ["fgd", "tessera", "best-fit", "random"])
def test_replay_reports_curves_that_respect_capacity(policy):
    result = replay(PODS, NODES, policy, seed=3, trace="tiny")
    assert result.pods > len(PODS) and result.failed > 0
    for arrived, alloc in result.alloc_pct.items():
        assert 0 <= alloc <= min(arrived + 2, 100)
    last = max(result.alloc_pct)  # a tiny cluster moves in steps of ~3%: 130 itself may have no record
    assert last >= 126 and 80 <= result.alloc_pct[last] <= 100
    assert len(result.decision_s) == result.pods


def test_replay_is_deterministic_per_seed():
    a = replay(PODS, NODES, "fgd", seed=5)
    b = replay(PODS, NODES, "fgd", seed=5)
    assert a.alloc_pct == b.alloc_pct and a.failed == b.failed


@pytest.fixture
def tiny_files(tmp_path):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(f"{n.name},{n.cpu_milli},{n.memory_mib},{n.gpus},{n.model}\n" for n in NODES)
    )
    pods = tmp_path / "openb_pod_list_tiny.csv"
    header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
    pods.write_text(
        header
        + "".join(
            f"{p.name},{p.cpu_milli},{p.memory_mib},{p.num_gpu},{p.gpu_milli},{p.gpu_spec}\n" for p in PODS
        )
        + "bad,-5,1,1,1,\n"
    )
    return pods, nodes


def test_cli_replay_json_has_the_documented_keys(tiny_files, capsys):
    pods, nodes = tiny_files
    assert (
        main(
            [
                "replay",
                "--trace",
                str(pods),
                "--nodes",
                str(nodes),
                "--seeds",
                "1-2",
                "--policy",
                "fgd",
                "--json",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    row = json.loads(out)
    assert {
        "policy",
        "trace",
        "seeds",
        "alloc_pct",
        "frag_ratio_pct",
        "decisions_per_s",
        "p99_decision_ms",
    } <= set(row)
    assert (
        row["seeds"] == [1, 2] and set(row["alloc_pct"]) == {"100", "130"} and "90" in row["frag_ratio_pct"]
    )
    assert f"{pods}:7: column cpu_milli is negative" in err


def test_cli_compare_writes_table_and_plot(tiny_files, tmp_path, capsys):
    pods, nodes = tiny_files
    out = tmp_path / "results"
    args = [
        "compare",
        "--trace",
        str(pods),
        "--nodes",
        str(nodes),
        "--seeds",
        "1",
        "--policies",
        "fgd,tessera",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    table = (out / "sched_compare_tiny.md").read_text()
    assert "| fgd |" in table and "| tessera |" in table and "Command:" in table
    assert (out / "sched_compare_tiny.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_refuses_bad_arguments(capsys):
    assert main(["replay", "--trace", "no-such-trace", "--seeds", "1"]) == 2
    assert "no trace named" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["replay", "--seeds", "x-y"])


@pytest.mark.skipif(not (DEFAULT_TRACE_DIR / "csv").is_dir(), reason="shared trace folder not present")
def test_reduced_alibaba_replay_keeps_fgd_above_best_fit():
    pods = load_pods(resolve_trace("default")).rows
    nodes = load_nodes(DEFAULT_TRACE_DIR / "csv" / "openb_node_list_gpu_node.csv").rows[::8]
    fgd = replay(pods, nodes, "fgd", seed=42)
    assert fgd.alloc_pct[130] > 85
    assert fgd.p99_decision_ms < 50
