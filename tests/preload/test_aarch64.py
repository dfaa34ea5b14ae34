"""The preload library built for Arm GPU nodes (Grace Hopper and the like): cross-compiled with
aarch64-linux-gnu-gcc and run under qemu-aarch64 on the fake driver. Its dlsym replacement is an
assembly stub per architecture, so the cap must hold on every path that goes through dlsym, and
RTLD_NEXT must still resolve after the caller, not after the stub."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import PRELOAD, GiB, parse_kv

ARM = PRELOAD / "build" / "aarch64"
SYSROOT = Path("/usr/aarch64-linux-gnu")
EM_AARCH64 = 183
# dlopen + dlsym on the handle, the runtime's way (dlsym of cuGetProcAddress, then each entry point
# from it, both versions), and cuGetProcAddress asked for itself.
RESOLVERS = ["dlopen", "gpa1:0", "gpa2:0", "gpa2:1", "gpa_self"]


@pytest.fixture(scope="module")
def arm(tmp_path_factory) -> Path:
    missing = [tool for tool in ("aarch64-linux-gnu-gcc", "qemu-aarch64") if shutil.which(tool) is None]
    if missing or not SYSROOT.is_dir():
        pytest.fail(f"the AArch64 tests need {', '.join(missing) or SYSROOT} (make setup-test installs "
                    "gcc-aarch64-linux-gnu and qemu-user)")
    built = subprocess.run(["make", "-s", "-C", str(PRELOAD), "aarch64"], capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    return tmp_path_factory.mktemp("aarch64")


def run_arm(root: Path, program: str, *args: object, preload: list[Path] | None = None,
            **env: str) -> subprocess.CompletedProcess[str]:
    # The guest's own loader variables go through -E: set on qemu itself, the host's loader would
    # try to preload an Arm library into the x86 emulator.
    guest = {"LD_LIBRARY_PATH": str(ARM / "test"), "FAKE_CUDA_STATE_DIR": str(root),
             "TESSERA_BUDGET_PATH": str(root / "budget"), "TESSERA_BROKER_SOCKET": str(root / "no-broker.sock"),
             **env}
    if preload:
        guest["LD_PRELOAD"] = " ".join(map(str, preload))
    cmd = ["qemu-aarch64", "-L", str(SYSROOT)]
    for key, value in guest.items():
        cmd += ["-E", f"{key}={value}"]
    cmd += [str(ARM / "test" / program), *map(str, args)]
    return subprocess.run(cmd, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120)


def test_the_library_is_built_for_arm(arm: Path) -> None:
    header = (ARM / "libtessera_preload.so").read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == EM_AARCH64


@pytest.mark.parametrize("resolver", RESOLVERS)
def test_the_cap_holds_on_arm_through_dlsym_and_cu_get_proc_address(arm: Path, resolver: str) -> None:
    result = run_arm(arm, "memcap", resolver, "alloc", GiB, preload=[ARM / "libtessera_preload.so"],
                     TESSERA_GPU_MEMORY_LIMIT="1Gi")
    assert result.returncode == 0, result.stderr
    out = parse_kv(result.stdout)
    assert (out["first"], out["second"], out["fake_delta"]) == (0, 2, 0)  # 3/4 fits, 3/4 + 1/2 refused
    assert (out["freed"], out["third"]) == (0, 0)
    assert (out["total"], out["device_total"]) == (GiB, GiB)


def test_the_cap_holds_on_arm_when_linked_against_the_driver(arm: Path) -> None:
    result = run_arm(arm, "memcap_direct", "direct", "managed", GiB, preload=[ARM / "libtessera_preload.so"],
                     TESSERA_GPU_MEMORY_LIMIT="1Gi")
    assert result.returncode == 0, result.stderr
    assert parse_kv(result.stdout)["second"] == 2


def test_without_the_library_the_arm_fake_driver_allocates_past_the_cap(arm: Path) -> None:
    result = run_arm(arm, "memcap", "dlopen", "alloc", GiB, TESSERA_GPU_MEMORY_LIMIT="1Gi")
    assert result.returncode == 0, result.stderr
    assert parse_kv(result.stdout)["second"] == 0


def test_rtld_next_still_means_after_the_caller_on_arm(arm: Path) -> None:
    # libnext.so wraps getpid and looks up the real one with dlsym(RTLD_NEXT); the stub must keep
    # the caller's return address (the link register) for glibc to resolve after libnext.so.
    result = run_arm(arm, "hog", GiB // 2, 1, 0, preload=[ARM / "libtessera_preload.so", ARM / "test" / "libnext.so"],
                     TESSERA_GPU_MEMORY_LIMIT="1Gi")
    assert result.returncode == 0, result.stderr
    assert "next_ok=1" in result.stderr
    assert parse_kv(result.stdout)["allocated"] == GiB // 2
