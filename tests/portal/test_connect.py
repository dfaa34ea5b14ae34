"""Connect without a server: declaring an app (request, preset, API), who may open it, what the pod
is told, the Kubernetes pod's port and label, the token masked in a stream cut anywhere, and the
reservation page's Open."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client

from portal.audit.services import Actor
from portal.connect import access
from portal.connect.proxy import Masker, same_origin, split_cookies
from portal.reservations import presets, rules
from portal.tenancy.policy import set_policy
from scheduler.backends import GpuShare, make_pod_spec
from scheduler.backends.kubernetes.manifests import pod_manifest
from tests.reservations import running, submitted

pytestmark = pytest.mark.django_db


def spec(team, **fields):
    return rules.ReservationSpec(team=team, image="jupyter/base-notebook:2024", gpu_request=Decimal("0.25"),
                                 gpu_memory_mib=4096, kind="interactive", **fields)


def problems(team, **fields) -> dict:
    with pytest.raises(rules.RuleViolation) as caught:
        rules.check(spec(team, **fields))
    return caught.value.errors


def test_an_app_listens_on_its_usual_port_unless_told(fleet, teams):
    s = spec(teams["vision"], app="jupyter")
    rules.check(s)
    assert s.app_port == 8888
    s = spec(teams["vision"], app="tensorboard", app_port="7007")
    rules.check(s)
    assert s.app_port == 7007
    s = spec(teams["vision"])
    rules.check(s)
    assert (s.app, s.app_port) == ("", None)


def test_bad_app_declarations_are_refused_in_words(fleet, teams):
    assert "give the port your app listens on" in problems(teams["vision"], app="port")["app_port"][0]
    assert problems(teams["vision"], app="jupyter", app_port=80)["app_port"] == ["a port between 1024 and 65535"]
    assert "choose one of jupyter" in problems(teams["vision"], app="emacs")["app"][0]
    assert "choose an app first" in problems(teams["vision"], app_port=9000)["app_port"][0]


def test_a_preset_declares_its_app_and_its_request_carries_it(fleet, teams, people):
    preset = presets.create_preset(teams["vision"], Actor(people["carol"]), {
        "name": "Notebook", "image": "jupyter/base-notebook:2024", "gpu_request": "0.25", "gpu_memory_mib": 4096,
        "app": "jupyter"})
    assert (preset.app, preset.app_port) == ("jupyter", None)
    assert presets.as_dict(preset)["app"] == "jupyter"
    with pytest.raises(rules.RuleViolation) as caught:
        presets.update_preset(preset, Actor(people["carol"]), {"app": "port"})
    assert "app_port" in caught.value.errors
    client = Client()
    client.force_login(people["alice"])
    client.post(f"/reservations/new/preset/{preset.pk}/")
    reservation = people["alice"].reservations.get()
    assert (reservation.app, reservation.app_port) == ("jupyter", 8888)


def test_the_api_takes_an_app(fleet, client_for, reservation_body):
    answer = client_for("alice").post("/api/v1/reservations/", reservation_body(app="port", app_port=6000),
                                      format="json")
    assert answer.status_code == 201, answer.content
    assert (answer.json()["app"], answer.json()["app_port"]) == ("port", 6000)
    refused = client_for("alice").post("/api/v1/reservations/", reservation_body(app="port"), format="json")
    assert refused.status_code == 400 and "app_port" in refused.json().get("errors", refused.json())


def test_only_the_owner_opens_it_and_team_admins_when_the_policy_says_so(fleet, teams, people):
    gpu = fleet.first()
    r = running(submitted(people["alice"], teams["vision"], gpu_request=Decimal("0.25"), gpu_memory_mib=4096,
                          kind="interactive", app="jupyter"), gpu)
    assert access.target_for(people["alice"], r.pk) is not None
    for name in ("alice2", "bob", "carol", "dave", "erin", "admin"):
        assert access.target_for(people[name], r.pk) is None, name
    set_policy(teams["vision"], Actor(people["carol"]), {"connect_admins": True})
    assert access.target_for(people["carol"], r.pk) is not None
    assert access.target_for(people["erin"], r.pk) is None  # an admin of another team
    assert access.target_for(people["alice2"], r.pk) is None
    plain = running(submitted(people["alice"], teams["vision"], gpu_request=Decimal("0.25"), gpu_memory_mib=4096),
                    gpu)
    assert access.target_for(people["alice"], plain.pk) is None  # no app declared


def test_the_pod_gets_the_token_port_and_base_url_and_kubernetes_admits_the_port(fleet):
    env = access.app_env(7, "jupyter", 8888)
    assert env == {"TESSERA_APP": "jupyter", "TESSERA_APP_PORT": "8888", "TESSERA_APP_TOKEN": access.app_token(7),
                   "TESSERA_APP_BASE_URL": "/connect/7/", "JUPYTER_TOKEN": access.app_token(7),
                   "JUPYTER_PORT": "8888", "NOTEBOOK_ARGS": "--ServerApp.base_url=/connect/7/"}
    assert "JUPYTER_TOKEN" not in access.app_env(7, "tensorboard", 6006)
    assert access.app_token(7) != access.app_token(8) and len(access.app_token(7)) == 64
    assert access.app_env(7, "", None) == {}
    pod = make_pod_spec(reservation_id="7", attempt=1, namespace="work", node="n1", team="vision", image="img:1",
                        command=(), gpus=(GpuShare("GPU-1", 0, 0.25, 0.5, 4096),), priority=50, kind="interactive",
                        extra_env=env)
    manifest = pod_manifest(pod)
    container = manifest["spec"]["containers"][0]
    assert container["ports"] == [{"name": "tessera-app", "containerPort": 8888, "protocol": "TCP"}]
    assert manifest["metadata"]["labels"]["sharedgpu/app"] == "jupyter"
    assert {"name": "TESSERA_APP_TOKEN", "value": access.app_token(7)} in container["env"]
    bare = pod_manifest(make_pod_spec(reservation_id="8", attempt=1, namespace="work", node="n1", team="vision",
                                      image="img:1", command=(), gpus=(GpuShare("GPU-1", 0, 0.25, 0.5, 4096),),
                                      priority=50, kind="interactive"))
    assert "ports" not in bare["spec"]["containers"][0] and "sharedgpu/app" not in bare["metadata"]["labels"]


@pytest.mark.parametrize("cut", [1, 7, 63, 64, 65, 100, 1000])
def test_the_token_is_masked_wherever_the_stream_cuts_it(cut):
    token = "ab" * 32
    body = (b"<html data-token='" + token.encode() + b"'>" + b"x" * 300 + token.encode() + b"</html>") * 3
    masker = Masker(token)
    out = b"".join(masker.feed(body[i:i + cut]) for i in range(0, len(body), cut)) + masker.end()
    assert len(out) == len(body)
    assert token.encode() not in out
    assert out == body.replace(token.encode(), b"0" * 64)


def test_the_portal_cookies_stay_behind():
    session, kept = split_cookies(b"sessionid=abc; _xsrf=2|x; csrftoken=t; username-127-0-0-1-8888=u")
    assert session == "abc"
    assert kept == "_xsrf=2|x; username-127-0-0-1-8888=u"


def test_the_reservation_page_shows_open_to_whom_it_opens_for(fleet, teams, people):
    gpu = fleet.first()
    pending = submitted(people["alice"], teams["vision"], gpu_request=Decimal("0.25"), gpu_memory_mib=4096,
                        kind="interactive", app="jupyter")
    r = running(submitted(people["alice"], teams["vision"], gpu_request=Decimal("0.25"), gpu_memory_mib=4096,
                          kind="interactive", app="jupyter"), gpu)
    alice, carol = Client(), Client()
    alice.force_login(people["alice"])
    carol.force_login(people["carol"])
    page = alice.get(f"/reservations/{r.pk}/").content.decode()
    assert f'href="/connect/{r.pk}/tree"' in page and ">Open</a>" in page
    assert access.app_token(r.pk) not in page
    waiting = alice.get(f"/reservations/{pending.pk}/").content.decode()
    assert "Open appears here once the pod runs." in waiting and "data-connect" not in waiting
    assert "data-connect" not in carol.get(f"/reservations/{r.pk}/").content.decode()  # sees the page, not Open


def test_team_admins_set_a_presets_app_and_the_policy_in_their_pages(fleet, teams, people):
    carol = Client()
    carol.force_login(people["carol"])
    answer = carol.post("/team/vision/presets/", {
        "name": "Board", "kind": "interactive", "gpu_model": "", "gpu_request": "0.25", "gpu_limit": "",
        "gpu_memory_mib": "4096", "max_duration_h": "", "image": "tensorflow/tensorflow:2.16.1", "command": "",
        "app": "tensorboard", "app_port": ""})
    assert answer.status_code == 302, answer.content.decode()[:2000]
    preset = teams["vision"].presets.get(name="Board")
    assert (preset.app, preset.app_port) == ("tensorboard", None)
    assert "opens TensorBoard" in carol.get("/team/vision/presets/").content.decode()
    refused = carol.post("/team/vision/presets/", {
        "name": "Port", "kind": "interactive", "gpu_model": "", "gpu_request": "0.25", "gpu_limit": "",
        "gpu_memory_mib": "4096", "max_duration_h": "", "image": "img:1", "command": "", "app": "port",
        "app_port": ""})
    assert refused.status_code == 400 and "give the port your app listens on" in refused.content.decode()
    page = carol.get("/team/vision/policy/").content.decode()
    assert 'name="connect_admins"' in page


def test_oversized_request_headers_are_refused_before_anything_else():
    import asyncio

    from portal.connect.proxy import ConnectProxy

    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}

    async def fallback(scope, receive, send):  # pragma: no cover - never reached for /connect/
        raise AssertionError("not for Django")

    scope = {"type": "http", "method": "GET", "path": "/connect/1/", "query_string": b"",
             "headers": [(b"x-filler", b"a" * 1024)] * 70}
    asyncio.run(ConnectProxy(fallback)(scope, receive, send))
    assert sent[0]["status"] == 431
    sent.clear()
    asyncio.run(ConnectProxy(fallback)({**scope, "headers": [(b"x-n", b"1")] * 101}, receive, send))
    assert sent[0]["status"] == 431


def test_a_page_of_another_site_may_not_drive_the_app():
    assert same_origin([(b"host", b"portal.example.org"), (b"origin", b"https://portal.example.org")])
    assert not same_origin([(b"host", b"portal.example.org"), (b"origin", b"https://evil.example")])
    assert same_origin([(b"host", b"portal.example.org")])  # no Origin: not a cross-site browser request
