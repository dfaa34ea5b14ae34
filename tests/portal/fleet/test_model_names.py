"""A GPU model has two names: NVML's (the display name, with spaces) and the label-safe one KubeShare
writes in `sharedgpu/gpu_model` (spaces as dashes). Both are accepted wherever a model is named, and
what is stored is the display name the engine matches on."""

from __future__ import annotations

import pytest

from portal.fleet.model_names import display_model, known_models, label_name
from portal.fleet.models import Gpu, Node
from portal.reservations.models import Reservation

URL = "/api/v1/reservations/"
A100 = "NVIDIA A100-SXM4-80GB"


@pytest.fixture
def alice(client_for, fleet):
    return client_for("alice")


@pytest.fixture
def nvml_fleet(fleet):
    node = Node.objects.create(name="dgx-1")
    for i in range(2):
        Gpu.objects.create(node=node, uuid=f"GPU-aaaaaaaa-0000-4000-8000-00000000000{i}", index=i, model=A100,
                           memory_mib=81920)
    return node


def test_the_database_keeps_the_label_safe_name_beside_the_display_name(nvml_fleet):
    gpu = Gpu.objects.get(node=nvml_fleet, index=0)
    assert gpu.model_label == "NVIDIA-A100-SXM4-80GB" == label_name(A100)
    Gpu.objects.filter(pk=gpu.pk).update(model="NVIDIA H100 80GB HBM3")  # a bulk write, no save()
    gpu.refresh_from_db()
    assert gpu.model_label == "NVIDIA-H100-80GB-HBM3"


def test_either_name_means_the_display_name_and_unknown_names_are_left_for_validation(nvml_fleet):
    assert display_model("NVIDIA-A100-SXM4-80GB") == A100
    assert display_model(f"{A100}|T4") == f"{A100}|T4"
    assert display_model("NVIDIA-A100-SXM4-80GB|NVIDIA A100-SXM4-80GB") == A100
    assert display_model("H100") == "H100" and display_model("") == ""
    known = known_models()
    assert known[A100] == known["NVIDIA-A100-SXM4-80GB"] == 81920


def test_a_display_name_is_confirmed_by_one_probe_not_by_reading_every_card(nvml_fleet,
                                                                             django_assert_num_queries):
    """Every submit that names a model asks this: Gpu's default ordering made DISTINCT return every
    matching card (4,000 rows per submit on a fleet of one model)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with django_assert_num_queries(1):
        assert display_model(A100) == A100
    Node.objects.create(name="dgx-2")
    twin = Gpu.objects.create(node=Node.objects.get(name="dgx-2"), uuid="GPU-bbbbbbbb-0000-4000-8000-000000000000",
                              index=0, model=A100.replace("-SXM4", " SXM4"), memory_mib=81920)  # same label
    with CaptureQueriesContext(connection) as captured:
        assert display_model(f"{A100}|{twin.model_label}|T4") == f"{A100}|{twin.model}|T4"
    assert all("ORDER BY" not in q["sql"] and "JOIN" not in q["sql"] for q in captured.captured_queries)


def test_the_api_takes_the_label_safe_name_and_stores_the_display_name(alice, reservation_body, nvml_fleet):
    r = alice.post(URL, reservation_body(gpu_model="NVIDIA-A100-SXM4-80GB"), format="json")
    assert r.status_code == 201, r.content
    assert r.json()["gpu_model"] == A100
    assert Reservation.objects.get(pk=r.json()["id"]).gpu_model == A100
    capacity = alice.get("/api/v1/capacity/", {"gpu_request": "0.5", "gpu_memory_mib": 1024,
                                               "gpu_model": "NVIDIA-A100-SXM4-80GB"})
    assert capacity.status_code == 200, capacity.content
    assert {g["model"] for g in capacity.json()["gpus"]} == {A100}


def test_the_gpu_list_and_the_fleet_page_show_the_label_safe_name(client_for, people, nvml_fleet):
    gpus = client_for("alice").get("/api/v1/gpus/").json()
    gpus = gpus.get("results", gpus)
    assert {(g["model"], g["model_label"]) for g in gpus if g["node"] == "dgx-1"} == {(A100, "NVIDIA-A100-SXM4-80GB")}
    from django.test import Client

    browser = Client()
    browser.force_login(people["admin"])
    page = browser.get("/fleet/", {"node": "dgx-1"})
    assert page.status_code == 200
    assert b"NVIDIA-A100-SXM4-80GB</code>" in page.content


def test_the_form_takes_either_name(people, nvml_fleet):
    from portal.web.forms import RequestForm

    for name in (A100, "NVIDIA-A100-SXM4-80GB"):
        form = RequestForm({"team": "vision", "kind": "batch", "image": "ghcr.io/x/y:1", "gpu_request": "0.5",
                            "memory_gib": "1", "gpu_count": 1, "gpu_model": name, "priority": 10},
                           user=people["alice"], models=[A100, "T4"])
        assert form.is_valid(), form.errors
        assert form.cleaned_data["gpu_model"] == A100


def test_a_preset_takes_the_label_safe_name_and_stores_the_display_name(teams, people, nvml_fleet):
    from portal.audit import services as audit
    from portal.reservations import presets

    preset = presets.create_preset(teams["vision"], audit.web(people["carol"]), {
        "name": "A100 notebook", "gpu_model": "NVIDIA-A100-SXM4-80GB", "gpu_request": "0.25",
        "gpu_memory_mib": 16384, "image": "jupyter/base-notebook:latest"})
    assert preset.gpu_model == A100  # what the request form and the engine match on
