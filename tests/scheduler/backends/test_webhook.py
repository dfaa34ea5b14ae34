"""The mutating webhook gives each container of a KubeShare pod one `tessera.io/gpu-share` slot (so
the device plugin is asked for it), leaves every other pod alone, and speaks AdmissionReview over TLS."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import ssl
import threading
import urllib.error
import urllib.request
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from scheduler.backends.kubernetes.webhook import (
    SHARE_RESOURCE,
    ReviewError,
    build_parser,
    make_server,
    review,
    share_patch,
)

from .conftest import load_fake_apiserver

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
apply = load_fake_apiserver().apply_json_patch


def kubeshare_pod(**spec_overrides):
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "nb", "namespace": "team-vision", "labels": {"sharedgpu/gpu_request": "0.5"}},
           "spec": {"schedulerName": "tessera", "containers": [
               {"name": "main", "image": "jupyter/base"},
               {"name": "sidecar", "image": "busybox", "resources": {"requests": {"cpu": "10m"}}},
               {"name": "tool", "image": "busybox", "resources": {"limits": {"memory": "64Mi"}}}]}}
    pod["spec"].update(spec_overrides)
    return pod


def test_every_container_of_a_kubeshare_pod_asks_for_one_share_slot_and_keeps_its_own_resources():
    pod = kubeshare_pod()
    mutated = apply(pod, share_patch(pod))
    limits = [c["resources"]["limits"] for c in mutated["spec"]["containers"]]
    assert [lim[SHARE_RESOURCE] for lim in limits] == ["1", "1", "1"]
    assert limits[2]["memory"] == "64Mi" and mutated["spec"]["containers"][1]["resources"]["requests"] == {"cpu": "10m"}
    kubernetes_validate.validate(mutated, "1.34.0", strict=True)


def test_a_kubeshare_manifest_naming_kubeshare_scheduler_gets_its_slot_and_the_names_are_configurable(monkeypatch):
    pod = kubeshare_pod(schedulerName="kubeshare-scheduler")
    assert len(share_patch(pod)) == 4  # the mark, and a slot for each of the 3 containers
    monkeypatch.setenv("TESSERA_SCHEDULER_NAMES", "tessera")
    assert share_patch(pod) == []


def test_a_container_that_already_asks_is_left_as_written():
    pod = kubeshare_pod(containers=[{"name": "main", "image": "x", "resources": {"limits": {SHARE_RESOURCE: "2"}}}])
    assert [op["path"] for op in share_patch(pod)] == ["/metadata/labels/tessera.io~1reservation"]
    pod["metadata"]["labels"]["tessera.io/reservation"] = ""
    assert share_patch(pod) == []


def test_a_kubeshare_pod_is_marked_for_the_watch_with_an_empty_reservation_label():
    pod = kubeshare_pod()
    mutated = apply(pod, share_patch(pod))
    assert mutated["metadata"]["labels"] == {"sharedgpu/gpu_request": "0.5", "tessera.io/reservation": ""}


def test_a_pod_whose_claims_bring_its_gpus_is_only_marked():
    pod = kubeshare_pod()
    del pod["metadata"]["labels"]
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu-share-04-12gi"}]
    mutated = apply(pod, share_patch(pod))
    assert mutated["metadata"]["labels"] == {"tessera.io/reservation": ""}
    assert mutated["spec"]["containers"] == pod["spec"]["containers"]  # no share slot: the claim brings the GPU
    pod["spec"]["schedulerName"] = "default-scheduler"
    assert share_patch(pod) == []


@pytest.mark.parametrize("change", ["other scheduler", "no kubeshare label", "ours"])
def test_other_pods_are_not_touched(change):
    pod = kubeshare_pod()
    if change == "other scheduler":
        pod["spec"]["schedulerName"] = "default-scheduler"
    elif change == "no kubeshare label":
        pod["metadata"]["labels"] = {"app": "web"}
    else:
        pod["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "tessera"
    assert share_patch(pod) == []
    answer = review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                     "request": {"uid": "u1", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": pod}})
    assert answer["response"] == {"uid": "u1", "allowed": True}


@pytest.mark.parametrize("body", [None, [], {"kind": "Pod"}, {"kind": "AdmissionReview"},
                                  {"kind": "AdmissionReview", "request": {"uid": ""}}])
def test_what_is_not_an_admission_review_is_refused(body):
    with pytest.raises(ReviewError):
        review(body)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tessera-webhook.tessera.svc")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    d = tmp_path_factory.mktemp("tls")
    (d / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return d / "tls.crt", d / "tls.key"


@pytest.fixture
def https_webhook(tls_files):
    cert, key = tls_files
    server = make_server("127.0.0.1", 0, str(cert), str(key))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    context = ssl.create_default_context(cafile=str(cert))

    def post(path, body: bytes):
        req = urllib.request.Request(f"https://127.0.0.1:{server.server_address[1]}{path}", data=body,
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, context=context, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    yield post
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_the_api_server_gets_a_json_patch_over_tls(https_webhook):
    pod = kubeshare_pod()
    request = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
               "request": {"uid": "7b3f", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                           "operation": "CREATE", "namespace": "team-vision", "object": pod}}
    status, answer = https_webhook("/mutate", json.dumps(request).encode())
    assert status == 200 and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == "7b3f" and response["allowed"] is True and response["patchType"] == "JSONPatch"
    mutated = apply(pod, json.loads(base64.b64decode(response["patch"])))
    assert all(c["resources"]["limits"][SHARE_RESOURCE] == "1" for c in mutated["spec"]["containers"])


def test_a_malformed_request_gets_a_400_and_the_server_goes_on(https_webhook):
    assert https_webhook("/mutate", b"{not json")[0] == 400
    assert https_webhook("/elsewhere", b"{}")[0] == 404
    status, answer = https_webhook("/mutate", json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u2", "kind": {"kind": "Pod"}, "object": kubeshare_pod()}}).encode())
    assert status == 200 and answer["response"]["uid"] == "u2"


def test_the_webhook_configuration_reaches_the_server_as_deployed():
    docs = list(yaml.safe_load_all((DEPLOY / "portal" / "webhook.yaml").read_text()))
    deployment, service, config = docs
    hook, dra_hook = config["webhooks"]
    for h in (hook, dra_hook):
        assert h["clientConfig"]["service"]["name"] == service["metadata"]["name"]
        assert h["clientConfig"]["service"]["path"] == "/mutate"
    assert hook["objectSelector"]["matchExpressions"][0]["key"] == "sharedgpu/gpu_request"
    assert "has(object.spec.resourceClaims)" in dra_hook["matchConditions"][0]["expression"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.port == container["ports"][0]["containerPort"] and args.cert_file and args.key_file
