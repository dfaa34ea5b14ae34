"""Which client runtime a program loads, and whether it works there: the remote client's
libcudart.so.N built against CUDA N's headers (as the Dockerfile builds 12 and 13) against the old
image's one library, built against CUDA 12.6's headers but named libcudart.so.13.

    .venv/bin/python bench/remote/soname_check.py --cuda12-home DIR

DIR holds CUDA 12's headers in DIR/include (cuda_runtime_api.h and crt/; e.g. the include directories
of the nvidia-cuda-runtime-cu12 and nvidia-cuda-nvcc-cu12 wheels merged); CUDA 13's are the installed
toolkit's. A small runtime-API program (rt_props.c: device properties, memory info, a copy there and
back) is built against each major's headers and linked as `nvcc -cudart shared` links it (NEEDED
libcudart.so.<major>), then run against the remote server on the fake driver (as tests/remote) with
each client directory. Writes bench/results/remote/soname.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.remote.conftest import GpuHost, MiB, base_env, make  # noqa: E402

PRELOAD = REPO / "preload"
RESULTS = REPO / "bench" / "results" / "remote" / "soname.md"


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda12-home", type=Path, required=True)
    parser.add_argument("--cuda13-home", type=Path, default=Path("/usr/local/cuda"))
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="soname-"))
    make("remote", "test-bins")
    clients = {"CUDA 13 build (libcudart.so.13)": PRELOAD / "build/remote/client"}
    b12 = tmp / "b12"
    sh("make", "-s", "-C", str(PRELOAD), f"BUILD={b12}", f"CUDA_HOME={args.cuda12_home}", "remote")
    clients["CUDA 12 build (libcudart.so.12)"] = b12 / "remote/client"
    # The old image: CUDA 12.6's headers, named .so.13 (the soname check of cudart.c left out).
    old = tmp / "old13"
    old.mkdir()
    sh("cp", str(b12 / "remote/client/libcuda.so.1"), str(old))
    (old / "map").write_text("libcudart.so.13 { global: *; };\n")
    sh("cc", f"-I{args.cuda12_home}/include", f"-I{PRELOAD}/common", "-D_GNU_SOURCE", "-O2", "-std=gnu11", "-fPIC",
       "-pthread", "-fvisibility=hidden", "-shared", "-Wl,-soname,libcudart.so.13", f"-Wl,--version-script,{old}/map",
       "-o", str(old / "libcudart.so.13"), str(PRELOAD / "remote/cudart.c"), f"-L{old}", "-l:libcuda.so.1")
    clients["old image (12.6 headers named libcudart.so.13)"] = old
    programs = {}
    for major, home in ((12, args.cuda12_home), (13, args.cuda13_home)):
        lib = clients[f"CUDA {major} build (libcudart.so.{major})"]
        programs[f"CUDA {major} program"] = tmp / f"rt{major}"
        sh("cc", f"-I{home}/include", "-o", str(tmp / f"rt{major}"), str(REPO / "bench/remote/rt_props.c"),
           f"-L{lib}", f"-l:libcudart.so.{major}")
    host = GpuHost(root=tmp, secret=b"0123456789abcdef0123456789abcdef").start()
    rows = []
    try:
        token = host.token(memory=256 * MiB)
        for prog_name, prog in programs.items():
            for client_name, directory in clients.items():
                env = base_env()
                env.update(LD_LIBRARY_PATH=str(directory), TESSERA_REMOTE_SERVER=host.address,
                           TESSERA_REMOTE_TOKEN=token)
                done = subprocess.run([str(prog)], env=env, capture_output=True, text=True, timeout=60)
                said = (done.stdout.strip() or done.stderr.strip().split(": ", 1)[-1])[:160]
                rows.append((prog_name, client_name, done.returncode, said))
    finally:
        host.stop()
    lines = ["# Which client runtime a program loads (bench/remote/soname_check.py)", "",
             f"Command: `.venv/bin/python bench/remote/soname_check.py --cuda12-home {args.cuda12_home}`", "",
             "| program | client libraries | exit | what it printed |", "| --- | --- | --- | --- |"]
    lines += [f"| {p} | {c} | {rc} | `{s}` |" for p, c, rc, s in rows]
    lines += ["", "A program runs only on the runtime of its own major, built against that major's headers. With "
              "the old image's one library, CUDA 12 programs find no libcudart.so.12 and CUDA 13 programs miss "
              "the entry points CUDA 12's headers rename (cudaGetDeviceProperties is _v2 there). Where the "
              "client directory lacks the program's major, the dynamic linker may find NVIDIA's own runtime "
              "on the machine (ld.so.cache), which without a driver answers 35 (cudaErrorInsufficientDriver)."]
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
