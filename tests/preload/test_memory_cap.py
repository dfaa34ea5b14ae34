"""The memory cap holds on every way a program can reach the driver, and the memory queries show it."""

from __future__ import annotations

import struct
import sys
import textwrap

import pytest

from .conftest import LIBRARY, TEST_BIN, Env, GiB, MiB, parse_kv

RESOLVERS = ["direct", "dlopen", "gpa1:0", "gpa1:1", "gpa1:2", "gpa2:0", "gpa2:1", "gpa2:2", "gpa_self"]
APIS = ["alloc", "pitch", "managed", "async", "async_ptsz", "pool", "pool_ptsz", "create", "array", "array3d",
        "mipmap"]


def memcap(env: Env, resolver: str, api: str, cap: int) -> dict[str, int]:
    program = "memcap_direct" if resolver == "direct" else "memcap"
    result = env.run(program, resolver, api, cap)
    assert result.returncode == 0, result.stderr
    return parse_kv(result.stdout)


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("resolver", RESOLVERS)
def test_allocation_over_the_cap_fails_and_allocates_nothing(capped: Env, resolver: str, api: str) -> None:
    out = memcap(capped.with_(TESSERA_GPU_MEMORY_LIMIT="1Gi"), resolver, api, GiB)
    assert out["first"] == 0  # 3/4 of the cap fits
    assert out["second"] == 2  # CUDA_ERROR_OUT_OF_MEMORY: 3/4 + 1/2 does not
    assert out["fake_delta"] == 0  # and the driver never saw the refused call
    assert out["freed"] == 0
    assert out["third"] == 0  # the freed bytes came back
    assert out["total"] == GiB
    # mipmap levels (1 + 1/4 + 1/16 of the first) do not sum to a power of two exactly
    assert out["free"] == pytest.approx(GiB // 2, abs=MiB if api == "mipmap" else 0)
    assert out["device_total"] == GiB


def test_without_the_library_the_fake_driver_allocates_past_the_cap(bare: Env) -> None:
    out = memcap(bare.with_(TESSERA_GPU_MEMORY_LIMIT="1Gi"), "dlopen", "alloc", GiB)
    assert out["second"] == 0
    assert out["total"] == 16 * GiB


CUDA_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation (and CUDA_ERROR_OUT_OF_MEMORY)


@pytest.mark.parametrize("program", ["cudart_shared", "cudart_static"])
def test_the_cap_holds_through_the_cuda_runtime(capped: Env, program: str) -> None:
    # NVIDIA's libcudart from the toolkit, shared and static, on the fake driver (which answers the
    # runtime's private export tables). The runtime resolves the driver through dlsym +
    # cuGetProcAddress; the cap must hold for cudaMalloc and show in cudaMemGetInfo and the device's
    # properties.
    result = capped.with_(TESSERA_GPU_MEMORY_LIMIT="1Gi", TESSERA_LOG_LEVEL="debug").run(program, GiB)
    assert result.returncode == 0, result.stderr
    out = parse_kv(result.stdout)
    assert out["info"] == 0, result.stdout
    assert (out["total"], out["free"], out["device_total"]) == (GiB, GiB, GiB)
    assert out["first"] == 0  # 3/4 of the cap fits
    assert out["second"] == CUDA_ERROR_MEMORY_ALLOCATION  # 3/4 + 1/2 does not
    assert out["fake_delta"] == 0  # the driver never saw the refused call
    assert (out["freed"], out["third"]) == (0, 0)  # cudaFree gave the bytes back
    assert out["free_after"] == GiB // 2
    # The cuMemAlloc the runtime hands out (cudaGetDriverEntryPointByVersion) is ours too.
    assert (out["over_cap"], out["under_cap"]) == (CUDA_ERROR_MEMORY_ALLOCATION, 0)
    hooked = {
        line.split("cuGetProcAddress(")[1].split(")")[0]
        for line in result.stderr.splitlines()
        if line.endswith(": hooked")
    }
    names = {h.split(",")[0] for h in hooked}
    for name in ["cuMemAlloc", "cuMemAllocPitch", "cuMemAllocManaged", "cuMemAllocAsync",
                 "cuMemAllocFromPoolAsync", "cuMemFree", "cuMemFreeAsync", "cuArrayCreate", "cuArray3DCreate",
                 "cuArrayDestroy",
                 "cuMemGetInfo", "cuDeviceTotalMem", "cuLaunchKernel", "cuLaunchKernelEx",
                 "cuLaunchCooperativeKernel", "cuGraphLaunch", "cuGetProcAddress"]:
        assert name in names, f"{program} resolved {name} around the library"
    # the per-thread-default-stream variants too
    for name in ["cuMemAllocAsync", "cuLaunchKernel", "cuGraphLaunch", "cuLaunchKernelEx"]:
        assert any(h.startswith(name + ",") and h.endswith(", 2") for h in hooked), name


@pytest.mark.parametrize("program", ["cudart_shared", "cudart_static"])
def test_without_the_library_the_cuda_runtime_sees_the_whole_fake_card(bare: Env, program: str) -> None:
    result = bare.with_(TESSERA_GPU_MEMORY_LIMIT="1Gi").run(program, GiB)
    assert result.returncode == 0, result.stderr
    out = parse_kv(result.stdout)
    assert (out["total"], out["device_total"]) == (16 * GiB, 16 * GiB)
    assert out["second"] == 0 and out["fake_delta"] == GiB // 2


PY_CTYPES = textwrap.dedent(
    """
    import ctypes, sys
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    ptr = ctypes.c_ulonglong()
    first = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(600 << 20))
    second = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(600 << 20))
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
    print(f"first={first} second={second} free={free.value} total={total.value}")
    """
)


def test_python_ctypes_is_capped(capped: Env) -> None:
    result = capped.with_(TESSERA_GPU_MEMORY_LIMIT="1Gi").run(sys.executable, "-c", PY_CTYPES)
    assert result.returncode == 0, result.stderr
    out = parse_kv(result.stdout)
    assert (out["first"], out["second"]) == (0, 2)
    assert out["total"] == GiB
    assert out["free"] == GiB - 600 * MiB


PY_NVML = textwrap.dedent(
    """
    import ctypes, pynvml
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuInit(0)
    ptr = ctypes.c_ulonglong()
    assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(256 << 20)) == 0
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    print(f"total={v1.total} used={v1.used} free={v1.free} total2={v2.total} used2={v2.used} free2={v2.free}")
    """
)


def test_nvml_shows_the_share_not_the_card(capped: Env) -> None:
    result = capped.with_(TESSERA_GPU_MEMORY_LIMIT="2Gi").run(sys.executable, "-c", PY_NVML)
    assert result.returncode == 0, result.stderr
    out = parse_kv(result.stdout)
    assert out["total"] == out["total2"] == 2 * GiB
    assert out["used"] == out["used2"] == 256 * MiB
    assert out["free"] == out["free2"] == 2 * GiB - 256 * MiB


def test_nvml_without_the_library_shows_the_card(bare: Env) -> None:
    result = bare.run(sys.executable, "-c", PY_NVML)
    assert result.returncode == 0, result.stderr
    assert parse_kv(result.stdout)["total"] == 16 * GiB


@pytest.mark.parametrize(("text", "cap"), [("1073741824", GiB), ("1Gi", GiB), ("512Mi", 512 * MiB),
                                            ("2G", 2 * GiB), ("3072Ki", 3 * MiB)])
def test_memory_limit_units(capped: Env, text: str, cap: int) -> None:
    out = memcap(capped.with_(TESSERA_GPU_MEMORY_LIMIT=text), "dlopen", "alloc", cap)
    assert out["total"] == cap
    assert (out["first"], out["second"]) == (0, 2)


@pytest.mark.parametrize("text", ["lots", "-5", "1.5Gi", "12Qi", "", "99999999999999999999"])
def test_invalid_memory_limit_is_reported_and_allocates_nothing(capped: Env, text: str) -> None:
    env = capped.with_(TESSERA_GPU_MEMORY_LIMIT=text)
    result = env.run("memcap", "dlopen", "alloc", GiB)
    assert "TESSERA_GPU_MEMORY_LIMIT" in result.stderr
    assert "no GPU memory will be allocated" in result.stderr
    out = parse_kv(result.stdout)
    assert out["first"] == 2 and out["second"] == 2 and out["third"] == 2


def test_a_foreign_budget_file_is_refused_not_ignored(capped: Env) -> None:
    budget = capped.root / "budget"
    budget.write_bytes(struct.pack("<Q", 0xDEADBEEF) + bytes(4096 * 8))
    result = capped.with_(TESSERA_GPU_MEMORY_LIMIT="1Gi").run("memcap", "dlopen", "alloc", GiB)
    assert "unknown format" in result.stderr
    assert parse_kv(result.stdout)["first"] == 2


@pytest.mark.parametrize("order", ["library-first", "library-second"])
def test_driver_use_in_another_library_constructor(capped: Env, order: str) -> None:
    libs = [str(LIBRARY), str(TEST_BIN / "libctor.so")]
    if order == "library-second":
        libs.reverse()
    env = capped.with_(LD_PRELOAD=" ".join(libs), TESSERA_GPU_MEMORY_LIMIT="1Gi", CTOR_CAP=str(GiB))
    result = env.run("hog", 1, 1, 0, timeout=20)  # a deadlock would time out
    assert result.returncode == 0, result.stderr
    out = parse_kv(result.stdout)
    assert (out["ctor_over_cap"], out["ctor_under_cap"]) == (2, 0)


@pytest.mark.parametrize(("resolver", "api"),
                         [("gpa2:0", "alloc"), ("gpa1:0", "alloc"), ("gpa2:2", "async_ptsz")])
def test_unknown_driver_pointers_are_hooked_by_name(capped: Env, resolver: str, api: str) -> None:
    # the fake hands out internal entry points instead of its exported symbols
    env = capped.with_(TESSERA_GPU_MEMORY_LIMIT="1Gi", FAKE_GPA_ALIASES="1", TESSERA_LOG_LEVEL="info")
    result = env.run("memcap", resolver, api, GiB)
    assert "unknown driver pointer, hooked by name" in result.stderr
    out = parse_kv(result.stdout)
    assert (out["first"], out["second"], out["third"], out["fake_delta"]) == (0, 2, 0, 0)



def test_rtld_next_still_means_after_the_caller(capped: Env) -> None:
    env = capped.with_(LD_PRELOAD=f"{LIBRARY} {TEST_BIN / 'libnext.so'}", TESSERA_GPU_MEMORY_LIMIT="1Gi")
    result = env.run("hog", GiB // 2, 1, 0, timeout=20)
    assert result.returncode == 0, result.stderr
    assert "next_ok=1" in result.stderr
    assert parse_kv(result.stdout)["allocated"] == GiB // 2
