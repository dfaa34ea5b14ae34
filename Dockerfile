# syntax=docker/dockerfile:1
# The two images deploy/ runs (see deploy/README.md):
#   docker build --target portal -t tessera/portal:0.1.0 .   (web, API, workers, beat, webhook)
#   docker build --target agent  -t tessera/agent:0.1.0 .    (node agent, share broker, device plugin,
#                                                              and the preload library to install)

# CUDA 13's headers, for the remote client runtime of CUDA 13 programs (below). Only headers are
# taken: the libraries are built on the old glibc of the next stage.
FROM nvidia/cuda:13.0.1-devel-ubuntu24.04 AS cuda13

# The preload library and the remote client libraries are loaded into the users' own containers, so
# they are built against an old glibc (2.31) to load in nearly any image; only the CUDA headers are
# needed, never the CUDA libraries.
# The client runtime's soname is the CUDA major whose headers it is built against (its
# cudaDeviceProp layout and launch entry points are that major's): a program built with
# `nvcc -cudart shared` by CUDA 12 loads libcudart.so.12, by CUDA 13 libcudart.so.13. Both are built,
# each against its own headers (the Makefile refuses a soname that does not match the headers).
FROM nvidia/cuda:12.6.3-devel-ubuntu20.04 AS preload
WORKDIR /src
COPY preload/Makefile preload/
COPY preload/src preload/src
COPY preload/common preload/common
COPY preload/remote preload/remote
COPY --from=cuda13 /usr/local/cuda/include /opt/cuda-13/include
RUN make -C preload CUDA_HOME=/usr/local/cuda \
    && make -C preload CUDA_HOME=/opt/cuda-13 build/remote/client/libcudart.so.13 \
    && test -e preload/build/remote/client/libcudart.so.12

FROM python:3.11.7-slim-bookworm AS python
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
# Dependencies first (pinned in pyproject.toml), so a code change does not reinstall them.
COPY pyproject.toml README.md ./
COPY portal portal
COPY scheduler scheduler
COPY agents agents
COPY wire wire
RUN pip install . && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin tessera

FROM python AS portal
COPY manage.py ./
COPY templates templates
COPY static static
COPY deploy/inventory deploy/inventory
# Static files are collected at build time (WhiteNoise serves them); the key is a throwaway.
RUN SECRET_KEY=collectstatic-only TESSERA_PROFILE=production ALLOWED_HOSTS=localhost \
    python manage.py collectstatic --noinput -v0
USER 10001
EXPOSE 8000
CMD ["python", "-m", "portal.serve", "--bind", "0.0.0.0", "--port", "8000", "--proxy-headers", "portal.asgi:application"]

FROM python AS agent
COPY --from=preload /src/preload/build/libtessera_preload.so /usr/lib/tessera/libtessera_preload.so
# Remote GPU shares: the server and its worker (deploy/agent/node-plugins.yaml), the client libraries.
COPY --from=preload /src/preload/build/remote/tessera-remote-server /src/preload/build/remote/tessera-remote-worker \
    /usr/lib/tessera/remote/
# The client libraries (libcuda.so.1, libcudart.so.12, libcudart.so.13): a remote share's pod copies
# them into its own emptyDir with an init container (scheduler/backends/kubernetes/manifests.py).
COPY --from=preload /src/preload/build/remote/client /usr/lib/tessera/remote/client
# The agent reads NVML and /proc of the host and the broker serves a host socket: run as the
# manifests say (deploy/agent/), not as a fixed user here.
CMD ["tessera-agent", "--help"]
