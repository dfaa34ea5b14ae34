"""Trace files: bad rows are reported with file and line, never crash the replay."""

import pytest

from scheduler.sim.trace import TraceError, load_nodes, load_pods, resolve_trace

HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


def test_bad_pod_rows_are_reported_and_skipped(tmp_path):
    path = tmp_path / "pods.csv"
    path.write_text(
        HEADER
        + "ok-1,4000,8192,1,500,,LS,Running,0,1,0\n"
        + "neg,-1,8192,1,500,,LS,Running,0,1,0\n"
        + "nan,abc,8192,1,500,,LS,Running,0,1,0\n"
        + "frac-multi,4000,8192,2,500,,LS,Running,0,1,0\n"
        + "short,4000\n"
        + "too-big,4000,8192,1,1500,,LS,Running,0,1,0\n"
        + "ok-2,0,0,0,0,,BE,Running,0,1,0\n"
    )
    loaded = load_pods(path)
    assert [p.name for p in loaded.rows] == ["ok-1", "ok-2"]
    assert len(loaded.problems) == 5
    assert loaded.problems[0].startswith(f"{path}:3:") and "negative" in loaded.problems[0]
    assert "not a number" in loaded.problems[1]
    assert "whole GPUs" in loaded.problems[2]
    assert f"{path}:6:" in loaded.problems[3]


def test_missing_column_is_an_error_with_the_file(tmp_path):
    path = tmp_path / "pods.csv"
    path.write_text("name,cpu_milli\nx,1\n")
    with pytest.raises(TraceError, match="missing column"):
        load_pods(path)


def test_node_rows_are_validated(tmp_path):
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,2,T4\nn2,64000,262144,2,\n,1,1,0,\n")
    loaded = load_nodes(path)
    assert [n.name for n in loaded.rows] == ["n1"]
    assert len(loaded.problems) == 2 and "needs a model" in loaded.problems[0]


def test_trace_names_resolve_to_shipped_files(tmp_path):
    with pytest.raises(TraceError, match="no trace named"):
        resolve_trace("does-not-exist", trace_dir=tmp_path)
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "openb_pod_list_tiny.csv").write_text(HEADER)
    assert resolve_trace("tiny", trace_dir=tmp_path).name == "openb_pod_list_tiny.csv"


def test_gpu_spec_column_is_optional(tmp_path):
    # The multigpu traces ship without it.
    path = tmp_path / "pods.csv"
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,4000,8192,2,1000\n")
    [pod] = load_pods(path).rows
    assert pod.num_gpu == 2 and pod.gpu_spec == ""
