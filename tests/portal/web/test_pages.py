"""The data scientist's pages, server side: home, request (presets, custom form, preview),
reservation page (extend, cancel, log, request again), and tenancy on every page and fragment."""

from decimal import Decimal

import pytest
from django.test import Client

from portal.reservations import rules, services
from portal.reservations.models import Reservation
from portal.reservations.states import State
from portal.tenancy.models import Preset, TeamPolicy
from tests.reservations import running, submitted
from tests.teams import set_any_quota


@pytest.fixture
def alice(people, fleet):
    client = Client()
    client.force_login(people["alice"])
    return client


def _form(**overrides) -> dict:
    data = {"team": "vision", "kind": "interactive", "image": "jupyter/base-notebook:1", "command": "",
            "gpu_model": "", "gpu_request": "0.3", "gpu_limit": "", "memory_gib": "4", "gpu_count": "1",
            "hours": "", "priority": "50"}
    data.update(overrides)
    return data


def _submit(people, teams, who="alice", team="vision", **kw) -> Reservation:
    spec = rules.ReservationSpec(team=teams[team], image="busybox:1", gpu_request=Decimal("0.2"),
                                 gpu_memory_mib=1024, **kw)
    return services.submit(people[who], spec)


def test_pages_need_sign_in(db):
    for url in ("/", "/reservations/new/", "/reservations/1/", "/reservations/new/preview/"):
        r = Client().get(url)
        assert r.status_code == 302 and r["Location"].startswith("/login/"), url


def test_request_in_human_units_lands_on_the_reservation_page(alice):
    r = alice.post("/reservations/new/", _form(memory_gib="12", hours="2", gpu_limit="0.6",
                                               command="python train.py --name 'my run'"))
    row = Reservation.objects.get()
    assert r.status_code == 302 and r["Location"] == f"/reservations/{row.pk}/"
    assert (row.gpu_memory_mib, row.max_duration_s, row.gpu_limit) == (12 * 1024, 7200, Decimal("0.600"))
    assert row.command == ["python", "train.py", "--name", "my run"]
    page = alice.get(r["Location"]).content.decode()
    assert f"Reservation {row.pk} submitted" in page and "12 GiB" in page and "0.3 – 0.6" in page


@pytest.mark.parametrize("overrides, message", [
    ({"gpu_request": "0.6", "gpu_limit": "0.3"}, "The limit can&#x27;t be below the share you ask for (0.6)."),
    ({"command": "python 'unclosed"}, "could not be split like a shell would"),
    ({"memory_gib": "900"}, "900 GiB is more than any card holds (80 GiB)"),
    ({"gpu_request": "0"}, "Ask for at least 0.01 of a GPU."),
])
def test_errors_are_in_the_users_words_and_nothing_is_written(alice, overrides, message):
    r = alice.post("/reservations/new/", _form(**overrides))
    assert r.status_code == 400 and message in r.content.decode()
    assert "gpu_memory_mib" not in r.content.decode() and not Reservation.objects.exists()


def test_priority_above_the_roles_ceiling_is_refused(alice, teams):
    TeamPolicy.objects.create(team=teams["vision"], max_priority_member=40)
    page = alice.get("/reservations/new/").content.decode()
    assert "allows up to 40" in page
    r = alice.post("/reservations/new/", _form(priority="60"))
    assert r.status_code == 400 and "priority up to 40" in r.content.decode()
    assert not Reservation.objects.exists()


def test_preview_follows_the_fields(alice):
    fits = alice.get("/reservations/new/preview/", _form()).content.decode()
    assert 'data-fits="yes"' in fits and "A100-80GB" in fits and 'data-admission="guaranteed"' in fits
    assert "Your team's quota" in fits and "any model" in fits and "0 of 2" in fits
    # Beyond vision's quota of 2.0: it would borrow what others lend, and says what that means.
    beyond = alice.get("/reservations/new/preview/", _form(gpu_count="3", gpu_request="1", memory_gib="8")).content
    assert 'data-fits="yes"' in beyond.decode() and 'data-admission="borrowed"' in beyond.decode()
    assert "may be reclaimed with 5 min warning" in beyond.decode()
    invalid = alice.get("/reservations/new/preview/", _form(memory_gib="")).content.decode()
    assert 'data-fits="invalid"' in invalid and "GPU memory (GiB)" in invalid
    assert not Reservation.objects.exists()


def test_preview_says_why_it_would_wait_and_where_in_the_queue(alice, people, fleet, teams):
    """Both T4s taken by nlp work that ends in 3 h: a T4 request waits, first in the queue."""
    set_any_quota(teams["nlp"], share=2)  # room in nlp's quota for two whole T4s
    for gpu in fleet.filter(model="T4"):
        running(submitted(people["bob"], teams["nlp"], image="i", gpu_request=Decimal(1), gpu_memory_mib=1024,
                          max_duration_s=3 * 3600), gpu)
    body = alice.get("/reservations/new/preview/", _form(gpu_model="T4", memory_gib="4")).content.decode()
    assert 'data-fits="no"' in body and "Queue position</dt><dd>1</dd>" in body and "in 2 h 59 min" in body
    assert "Not enough free compute" in body or "No GPU fits" in body, body
    body = alice.get("/reservations/new/preview/", _form(gpu_model="A100-80GB", memory_gib="4")).content.decode()
    assert 'data-fits="yes"' in body


def test_preset_first_and_one_click_request(alice, people, teams):
    preset = Preset.objects.create(team=teams["vision"], name="Half A100, 24 GiB, 8 h", gpu_model="A100-80GB",
                                   gpu_request=Decimal("0.5"), gpu_limit=Decimal("0.5"), gpu_memory_mib=24576,
                                   max_duration_s=8 * 3600, image="jupyter/base-notebook:1")
    other = Preset.objects.create(team=teams["nlp"], name="NLP only", gpu_request=Decimal("0.1"),
                                  gpu_limit=Decimal("0.1"), gpu_memory_mib=1024, image="busybox:1")
    page = alice.get("/reservations/new/").content.decode()
    assert "Half A100, 24 GiB, 8 h" in page and "NLP only" not in page
    assert page.index("Presets") < page.index("Custom request")
    customise = alice.get(f"/reservations/new/?preset={preset.pk}").content.decode()
    assert 'value="24"' in customise and 'value="8"' in customise
    TeamPolicy.objects.create(team=teams["vision"], max_priority_member=30)
    r = alice.post(f"/reservations/new/preset/{preset.pk}/")
    row = Reservation.objects.get()
    assert r["Location"] == f"/reservations/{row.pk}/" and row.gpu_memory_mib == 24576 and row.priority == 30
    assert alice.post(f"/reservations/new/preset/{other.pk}/").status_code == 404
    assert alice.get(f"/reservations/new/?preset={other.pk}").status_code == 404


def test_home_shows_my_cards_quota_and_free_capacity(alice, people, teams):
    mine = _submit(people, teams)
    teammate = _submit(people, teams, who="alice2")
    html = alice.get("/").content.decode()
    assert f'id="reservation-{mine.pk}"' in html and f'id="reservation-{teammate.pk}"' not in html
    assert "Place in the queue" in html and "Team quota" in html and "Free now, by GPU model" in html
    assert f'data-live-groups="team:{teams["vision"].pk}"' in html
    assert alice.get(f"/reservations/{teammate.pk}/card/?mine=1").status_code == 204
    assert alice.get(f"/reservations/{teammate.pk}/card/").status_code == 200  # a teammate's is visible


def test_reservation_page_extend_cancel_and_request_again(alice, people, teams, fleet):
    TeamPolicy.objects.create(team=teams["vision"], max_duration_s=4 * 3600)
    r = running(submitted(people["alice"], teams["vision"], image="img", kind="interactive",
                          gpu_request=Decimal("0.5"), gpu_memory_mib=2048, max_duration_s=3600),
                fleet.filter(model="A100-80GB").first())
    page = alice.get(f"/reservations/{r.pk}/").content.decode()
    assert "chart-compute" in page and "Timeline" in page
    assert f"kubectl port-forward -n {r.pod_namespace} pod/{r.pod_name}" in page and r.pod_name
    refused = alice.post(f"/reservations/{r.pk}/extend/", {"hours": "5"}, HTTP_HX_REQUEST="true").content.decode()
    assert "allows reservations of at most 4 h" in refused
    ok = alice.post(f"/reservations/{r.pk}/extend/", {"hours": "2"}, HTTP_HX_REQUEST="true").content.decode()
    r.refresh_from_db()
    assert r.max_duration_s == 3 * 3600 and "extended by 2 h to 3 h" in ok
    assert 'hx-swap-oob="beforeend:#toasts"' in ok and "Extended by 2 h." in ok  # its toast comes with the fragment
    assert "Extended by 2 h." not in alice.get("/reservations/new/").content.decode()  # not again on the next page
    again = alice.get(f"/reservations/new/?again={r.pk}").content.decode()
    assert 'value="img"' in again and 'value="2"' in again and "Request again" in again
    alice.post(f"/reservations/{r.pk}/cancel/")
    r.refresh_from_db()
    assert r.state == State.CANCELLED
    assert "Cancel reservation" not in alice.get(f"/reservations/{r.pk}/").content.decode()


def test_log_fragment_says_why_there_is_none(alice, people, teams):
    r = _submit(people, teams)
    assert "No pod yet" in alice.get(f"/reservations/{r.pk}/log/").content.decode()


def test_another_teams_reservation_is_404_everywhere(alice, people, teams):
    theirs = _submit(people, teams, who="bob", team="nlp")
    for url in (f"/reservations/{theirs.pk}/", f"/reservations/{theirs.pk}/?part=summary",
                f"/reservations/{theirs.pk}/card/", f"/reservations/{theirs.pk}/log/",
                f"/reservations/new/?again={theirs.pk}"):
        assert alice.get(url, HTTP_HX_REQUEST="true").status_code == 404, url
    for url in (f"/reservations/{theirs.pk}/extend/", f"/reservations/{theirs.pk}/cancel/"):
        assert alice.post(url, {"hours": "1"}).status_code == 404, url
    assert b"busybox" not in alice.get("/").content
    theirs.refresh_from_db()
    assert theirs.state == State.PENDING


def test_choosing_another_team_brings_its_labels(people, teams, fleet):
    from portal.tenancy.models import ExclusionGroup, Membership, Role

    Membership.objects.create(user=people["alice"], team=teams["nlp"], role=Role.MEMBER)
    ExclusionGroup.objects.create(team=teams["nlp"], label="nlp-private")
    client = Client()
    client.force_login(people["alice"])
    first = client.get("/reservations/new/").content.decode()  # nlp: the first of her teams
    assert 'value="nlp-private"' in first and 'value="secure"' not in first
    vision = client.get("/reservations/new/", _form(team="vision", memory_gib="6"),
                        HTTP_HX_REQUEST="true").content.decode()
    assert 'value="secure"' in vision and "nlp-private" not in vision and 'value="6"' in vision
