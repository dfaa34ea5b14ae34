"""A mutating admission webhook that makes KubeShare pods work with the device plugin unchanged.

A KubeShare 2.0 pod asks for its GPU with `sharedgpu/*` labels only, but the kubelet calls a device
plugin's Allocate only for containers that request its resource. For every pod created with
one of Tessera's scheduler names (`TESSERA_SCHEDULER_NAMES`, default `tessera,kubeshare-scheduler`)
and a `sharedgpu/gpu_request` label, this webhook adds
`tessera.io/gpu-share: 1` to the limits of each container that does not ask for it yet, so
`kubectl apply` of an existing KubeShare manifest needs nothing new.

Run it: ``python -m scheduler.backends.kubernetes.webhook --cert-file tls.crt --key-file tls.key``
(deploy/portal/webhook.yaml). It answers `POST /mutate` with an AdmissionReview (admission.k8s.io/v1).
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import ssl
import sys
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..base import MANAGED_BY, MANAGED_BY_LABEL, RESERVATION_LABEL
from .manifests import SHARE_RESOURCE, scheduler_names

log = logging.getLogger(__name__)

KUBESHARE_LABEL = "sharedgpu/gpu_request"
PATH = "/mutate"
MAX_BODY_BYTES = 3 * 1024 * 1024  # the API server's own request limit for objects


class ReviewError(ValueError):
    """The request is not an AdmissionReview we can answer."""


def _escape(key: str) -> str:
    # JSON Pointer (RFC 6901): "~" and "/" inside a key.
    return key.replace("~", "~0").replace("/", "~1")


def configured_names() -> tuple[str, ...]:
    return scheduler_names(os.environ.get("TESSERA_SCHEDULER_NAMES", ""))


def wants_share(pod: Mapping[str, Any], names: Sequence[str] | None = None) -> bool:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    return ((pod.get("spec") or {}).get("schedulerName") in (names or configured_names())
            and KUBESHARE_LABEL in labels and labels.get(MANAGED_BY_LABEL) != MANAGED_BY)


def uses_claims(pod: Mapping[str, Any], names: Sequence[str] | None = None) -> bool:
    """A pod for Tessera that asks for devices with ResourceClaims (DRA, deploy/dra/): it gets no share
    slot (its claims bring the GPU), only the mark."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    spec = pod.get("spec") or {}
    return (spec.get("schedulerName") in (names or configured_names()) and bool(spec.get("resourceClaims"))
            and labels.get(MANAGED_BY_LABEL) != MANAGED_BY)


def _mark(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    labels = (pod.get("metadata") or {}).get("labels")
    if labels is None:
        return [{"op": "add", "path": "/metadata/labels", "value": {RESERVATION_LABEL: ""}}]
    if RESERVATION_LABEL not in labels:
        return [{"op": "add", "path": f"/metadata/labels/{_escape(RESERVATION_LABEL)}", "value": ""}]
    return []


def share_patch(pod: Mapping[str, Any], names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """JSON Patch operations that give each container of a KubeShare pod one share slot, and mark
    the pod with an empty `RESERVATION_LABEL`: the backend's pod watch (which selects that label)
    follows it from the start, and its binding then needs one write (the Binding carries the
    placement; the reservation is read from it). A pod whose claims bring its GPUs is only marked."""
    if not wants_share(pod, names):
        return _mark(pod) if uses_claims(pod, names) else []
    ops: list[dict[str, Any]] = _mark(pod)
    for i, container in enumerate((pod.get("spec") or {}).get("containers") or ()):
        resources = container.get("resources")
        base = f"/spec/containers/{i}/resources"
        if not resources:
            ops.append({"op": "add", "path": base, "value": {"limits": {SHARE_RESOURCE: "1"}}})
        elif not resources.get("limits"):
            ops.append({"op": "add", "path": f"{base}/limits", "value": {SHARE_RESOURCE: "1"}})
        elif SHARE_RESOURCE not in resources["limits"]:
            ops.append({"op": "add", "path": f"{base}/limits/{_escape(SHARE_RESOURCE)}", "value": "1"})
    return ops


def review(body: Any) -> dict[str, Any]:
    """The AdmissionReview answer to an AdmissionReview request (raises ReviewError when it is not one)."""
    if not isinstance(body, dict) or body.get("kind") != "AdmissionReview":
        raise ReviewError("expected an AdmissionReview")
    request = body.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str) or not request["uid"]:
        raise ReviewError("request.uid: missing")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    pod = request.get("object")
    kind = (request.get("kind") or {}).get("kind")
    if kind == "Pod" and isinstance(pod, dict) and request.get("operation", "CREATE") == "CREATE":
        ops = share_patch(pod)
        if ops:
            meta = pod.get("metadata") or {}
            log.info("pod %s/%s: adding %s to %d container(s)", request.get("namespace") or meta.get("namespace"),
                     meta.get("name") or meta.get("generateName"), SHARE_RESOURCE, len(ops))
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
    return {"apiVersion": body.get("apiVersion") or "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": response}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug(fmt, *args)

    def do_POST(self) -> None:
        if self.path.split("?")[0] != PATH:
            self._answer(404, {"error": f"no such path; the webhook answers POST {PATH}"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 < length <= MAX_BODY_BYTES:
            self._answer(400, {"error": f"Content-Length must be 1..{MAX_BODY_BYTES}"})
            return
        try:
            answer = review(json.loads(self.rfile.read(length)))
        except (ValueError, ReviewError) as exc:  # JSON errors are ValueErrors too
            self._answer(400, {"error": str(exc)})
            return
        self._answer(200, answer)

    def _answer(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def make_server(host: str, port: int, cert_file: str | None, key_file: str | None) -> ThreadingHTTPServer:
    """The webhook's HTTPS server (plain HTTP only when no certificate is given: tests, local runs)."""
    server = ThreadingHTTPServer((host, port), _Handler)
    server.daemon_threads = True
    if cert_file:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(cert_file, key_file)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    return server


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m scheduler.backends.kubernetes.webhook",
                                     description="Adds tessera.io/gpu-share to KubeShare pods (mutating webhook).")
    parser.add_argument("--host", default="0.0.0.0")  # noqa: S104 - a webhook listens for the API server
    parser.add_argument("--port", type=int, default=8443)
    parser.add_argument("--cert-file", help="TLS certificate (PEM); the API server only calls HTTPS webhooks")
    parser.add_argument("--key-file", help="TLS private key (PEM)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if bool(args.cert_file) != bool(args.key_file):
        parser.error("--cert-file and --key-file go together")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        server = make_server(args.host, args.port, args.cert_file, args.key_file)
    except (OSError, ssl.SSLError) as exc:
        parser.error(f"cannot serve on {args.host}:{args.port}: {exc}")
    log.info("serving %s on %s:%d (%s)", PATH, args.host, args.port, "TLS" if args.cert_file else "plain HTTP")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
