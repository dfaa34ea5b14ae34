"""The reservation page's Terminal section: the owner's only, while the reservation is active; its
response alone admits style elements, those carrying the nonce the section hands to its script."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.db import transaction
from django.test import Client

from portal.fleet.models import Gpu
from tests.reservations import ended, running, submitted

pytestmark = pytest.mark.django_db


@pytest.fixture
def alices(fleet, people, teams):
    gpu = Gpu.objects.get(node__name="a100-node-1", index=0)
    with transaction.atomic():
        return running(submitted(people["alice"], teams["vision"], image="img", gpu_request=Decimal("0.25"),
                                 gpu_memory_mib=4096), gpu)


def _page(user, reservation):
    client = Client()
    client.force_login(user)
    return client.get(f"/reservations/{reservation.pk}/")


def _directives(response) -> dict[str, str]:
    return dict(d.strip().split(" ", 1) for d in response["Content-Security-Policy"].split(";"))


def test_the_owner_gets_the_terminal_and_its_style_nonce(people, alices):
    response = _page(people["alice"], alices)
    html = response.content.decode()
    assert 'id="terminal"' in html and "Connect terminal" in html
    nonce = re.search(r'data-style-nonce="([^"]+)"', html).group(1)
    directives = _directives(response)
    assert directives["style-src-elem"] == f"'self' 'nonce-{nonce}'"
    assert "unsafe" not in directives["style-src"] and directives["script-src"] == "'self'"
    again = re.search(r'data-style-nonce="([^"]+)"', _page(people["alice"], alices).content.decode()).group(1)
    assert again != nonce  # one per response


@pytest.mark.parametrize("who", ["alice2", "carol", "admin"])
def test_others_who_see_the_page_get_no_terminal_and_no_nonce(people, alices, who):
    response = _page(people[who], alices)
    assert response.status_code == 200
    assert 'id="terminal"' not in response.content.decode()
    assert "style-src-elem" not in _directives(response)


def test_an_ended_reservation_has_no_terminal(people, alices):
    ended(alices, "cancelled", "cancelled by user")
    assert 'id="terminal"' not in _page(people["alice"], alices).content.decode()
