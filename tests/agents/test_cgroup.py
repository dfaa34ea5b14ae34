"""Processes are mapped to pods from /proc/<pid>/cgroup, whatever the cgroup driver and runtime."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agents.cgroup import CgroupResolver, PodRef, parse_cgroup
from agents.gpus.base import ProcessReading
from agents.placements import PlacementTable
from agents.sampling import attribute
from wire.agent_portal import Placements

FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"


@pytest.mark.parametrize(
    ("fixture", "pod_uid", "container_id"),
    [
        ("v1_cgroupfs_burstable", "7d2a3b9e-1c4f-4e8a-9b6d-2f0e1a3c5d7b",
         "3f1e9d2c4b6a8f0e1d3c5b7a9f2e4d6c8b0a1f3e5d7c9b2a4f6e8d0c1b3a5f7e"),
        ("v1_cgroupfs_guaranteed", "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
         "a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8"),
        ("v2_systemd_containerd", "5c6d7e8f-9a0b-4c1d-8e2f-3a4b5c6d7e8f",
         "1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e"),
        ("v2_systemd_crio_besteffort", "f0e1d2c3-b4a5-4968-8776-a5b4c3d2e1f0",
         "b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e3f4a5b6c7d8e9f0a1b2c3"),
        ("v1_systemd_docker", "11223344-5566-4778-8899-aabbccddeeff",
         "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00"),
        ("v2_containerd_colon_form", "99887766-5544-4332-8110-ffeeddccbbaa",
         "4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f"),
        ("v1_pod_sandbox_no_container", "12345678-90ab-4cde-8f01-234567890abc", None),
    ],
)
def test_pod_and_container_are_read_from_the_cgroup(fixture, pod_uid, container_id):
    text = (FIXTURES / f"{fixture}.txt").read_text()
    assert parse_cgroup(text) == PodRef(pod_uid=pod_uid, container_id=container_id)


@pytest.mark.parametrize("fixture", ["v2_host_process", "v2_user_session"])
def test_processes_outside_pods_have_no_pod(fixture):
    assert parse_cgroup((FIXTURES / f"{fixture}.txt").read_text()) is None


def test_garbage_and_truncated_cgroup_files_have_no_pod():
    assert parse_cgroup("") is None
    assert parse_cgroup("not a cgroup file\n::\n") is None
    assert parse_cgroup("0::/kubepods/burstable/pod7d2a3b9e-1c4f\n") is None


def make_proc(root: Path, pid: int, fixture: str) -> None:
    (root / str(pid)).mkdir(parents=True)
    shutil.copy(FIXTURES / f"{fixture}.txt", root / str(pid) / "cgroup")


def test_resolver_reads_under_the_proc_root_and_tolerates_vanished_processes(tmp_path):
    make_proc(tmp_path, 4242, "v2_systemd_containerd")
    resolver = CgroupResolver(tmp_path)
    assert resolver.resolve(4242).pod_uid == "5c6d7e8f-9a0b-4c1d-8e2f-3a4b5c6d7e8f"
    assert resolver.resolve(999) is None  # exited between the NVML call and the lookup


def test_processes_are_attributed_to_the_reservation_placed_with_their_pod(tmp_path):
    make_proc(tmp_path, 4242, "v2_systemd_containerd")
    make_proc(tmp_path, 5151, "v1_cgroupfs_burstable")
    make_proc(tmp_path, 77, "v2_host_process")
    gpu = "GPU-e4ad3e86-d2fd-5887-b483-8cd513bef9e0"
    table = PlacementTable({gpu})
    table.apply(Placements.model_validate({
        "v": 1, "type": "placements", "revision": 1,
        "placements": [{"reservation": "r-9", "gpu_uuid": gpu, "request": 0.5, "limit": 0.5,
                        "memory_mib": None, "pod_uid": "5c6d7e8f-9a0b-4c1d-8e2f-3a4b5c6d7e8f"}],
    }))
    procs = [ProcessReading(pid=pid, gpu_uuid=gpu, mem_used_mib=100, sm_util_pct=None)
             for pid in (4242, 5151, 77)]
    attribute(procs, table, CgroupResolver(tmp_path))
    placed, unplaced, host = procs
    assert (placed.pod_uid, placed.reservation) == ("5c6d7e8f-9a0b-4c1d-8e2f-3a4b5c6d7e8f", "r-9")
    assert placed.container_id.startswith("1d2e3f4a")
    # A pod the portal did not place here (e.g. a whole-GPU pod from another scheduler).
    assert (unplaced.pod_uid, unplaced.reservation) == ("7d2a3b9e-1c4f-4e8a-9b6d-2f0e1a3c5d7b", None)
    assert (host.pod_uid, host.reservation) == (None, None)
