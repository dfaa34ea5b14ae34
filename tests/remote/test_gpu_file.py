"""The node's GPU list for its remote server (agents/remote/gpus.py): the UUIDs the agent reports,
one a line, or a failed start when there is nothing to serve."""

from __future__ import annotations

from agents.gpus.base import GpuDevice
from agents.remote.gpus import main


class Source:
    kind = "nvml"

    def __init__(self, uuids: list[str]) -> None:
        self._devices = [GpuDevice(i, u, "H100", 81559, 0, (), "disabled") for i, u in enumerate(uuids)]

    def devices(self) -> list[GpuDevice]:
        return self._devices


def test_the_gpu_file_lists_the_uuids_the_agent_reports(tmp_path) -> None:
    out = tmp_path / "gpus"
    assert main([str(out)], source=Source(["GPU-8d1c", "GPU-77aa"])) == 0
    assert out.read_text() == "GPU-8d1c\nGPU-77aa\n"
    assert [p.name for p in tmp_path.iterdir()] == ["gpus"]  # no temporary file left behind


def test_a_node_without_gpus_does_not_start_its_server(tmp_path, capsys) -> None:
    out = tmp_path / "gpus"
    assert main([str(out)], source=Source([])) == 1
    assert not out.exists()
    assert "NVML sees no GPU on this node" in capsys.readouterr().err
