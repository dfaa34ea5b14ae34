"""Fair share on the team admins' and data scientists' pages: the team's line per GPU model and who
borrows from it, the reclaim warning in the team policy, how a reservation counts (guaranteed,
borrowed with its warning, opportunistic), a borrowed one being reclaimed, a waiting one's place
and estimate, admission badges on the list, and each team's quotas per model on the home page.
Another team's pages and reservations are 404, as everywhere."""

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from portal.audit import services as audit
from portal.reservations import services
from portal.tenancy import policy, quotas
from portal.tenancy.models import TeamPolicy
from tests.reservations import placed, submitted

A100 = "A100-80GB"



@pytest.fixture
def a100s(fleet):
    return list(fleet.filter(model=A100).order_by("node__name", "index"))


def hold(people, teams, who, team, gpu, share, admission="guaranteed", priority=50):
    r = submitted(people[who], teams[team], gpu_request=Decimal(share), gpu_limit=Decimal(share), gpu_memory_mib=2048,
                  gpu_model=A100, priority=priority)
    return placed(r, gpu, admission=admission)


@pytest.fixture
def nlp_borrows(people, teams, a100s):
    """nlp holds 2.5 GPUs of share against its `*` quota of 1.5: 1.0 beyond it, borrowed."""
    hold(people, teams, "bob", "nlp", a100s[0], "1.0")
    hold(people, teams, "bob", "nlp", a100s[1], "0.5")
    return hold(people, teams, "bob", "nlp", a100s[2], "1.0", admission="borrowed")


def test_team_quota_page_shows_its_line_per_model_and_who_borrows(browser_for, teams, people, a100s, nlp_borrows):
    hold(people, teams, "alice", "vision", a100s[3], "0.5")
    html = browser_for("carol").get("/team/vision/quota/").content.decode()
    line = html[html.index('<tr data-bucket="*"'):]
    line = line[:line.index("</tr>")]
    assert "any model" in line
    assert re.findall(r'<span class="amt">([\d.]+)</span>', line) == ["2", "0.5", "1"]  # quota, in use, lent
    borrowers = html[html.index("Who borrows from you now"):html.index("Beyond the quota")]
    assert 'data-borrower="nlp"' in borrowers and "NLP" in borrowers
    assert re.search(r'<span class="amt">1</span>', borrowers)
    # nlp's own page: it borrows 1.0, nobody borrows from it.
    html = browser_for("erin").get("/team/nlp/quota/").content.decode()
    line = html[html.index('<tr data-bucket="*"'):]
    assert re.findall(r'<span class="amt">([\d.]+)</span>', line[:line.index("</tr>")]) == ["1.5", "2.5", "1"]
    assert "Nobody beside you holds beyond their quota" in html


@pytest.mark.parametrize(("who", "status"), [("erin", 404), ("bob", 404), ("alice", 403), ("dave", 403)])
def test_another_teams_quota_page_is_404_and_members_are_refused(browser_for, nlp_borrows, who, status):
    assert browser_for(who).get("/team/vision/quota/").status_code == status


def test_team_quota_page_with_quotas_per_model(browser_for, teams, people, a100s):
    quotas.replace_quotas(teams["vision"], audit.cli("test"), [
        {"gpu_model": A100, "gpu_share": "1", "gpu_memory_gib": "80", "gpus": 1},
        {"gpu_model": "*", "gpu_share": "1", "gpu_memory_gib": "16", "gpus": 1}])
    hold(people, teams, "alice", "vision", a100s[0], "1.0")
    hold(people, teams, "alice", "vision", a100s[1], "0.5", admission="borrowed")
    html = browser_for("carol").get("/team/vision/quota/").content.decode()
    assert "any other model" in html
    line = html[html.index(f'<tr data-bucket="{A100}" class="over"'):]
    assert re.findall(r'<span class="amt">([\d.]+)</span>', line[:line.index("</tr>")]) == ["1", "1.5", "0.5"]


def test_policy_page_sets_the_reclaim_warning(browser_for, teams):
    form = {"max_duration_h": "8", "interactive_max_h": "4", "idle_threshold_pct": "10", "idle_after_min": "15",
            "idle_action": "warn", "idle_warning_min": "20", "max_priority_member": "40", "max_priority_admin": "60",
            "reclaim_grace_min": "10"}
    page = browser_for("carol").get("/team/vision/policy/").content.decode()
    assert 'name="reclaim_grace_min" value="5"' in page  # the default, 300 s
    assert browser_for("carol").post("/team/vision/policy/", form).status_code == 302
    assert TeamPolicy.objects.get(team=teams["vision"]).reclaim_grace_s == 600
    r = browser_for("carol").post("/team/vision/policy/", form | {"reclaim_grace_min": "2000"})
    assert r.status_code == 400 and "between 0 (reclaimed at once) and 1440 minutes" in r.content.decode()
    r = browser_for("carol").post("/team/vision/policy/", form | {"reclaim_grace_min": "soon"})
    assert r.status_code == 400 and "a number of minutes, e.g. 5" in r.content.decode()
    assert browser_for("carol").post("/team/vision/policy/", form | {"reclaim_grace_min": "0"}).status_code == 302
    assert TeamPolicy.objects.get(team=teams["vision"]).reclaim_grace_s == 0
    assert browser_for("erin").post("/team/vision/policy/", form).status_code == 404


def summary(client, pk) -> str:
    r = client.get(f"/reservations/{pk}/", {"part": "summary"}, HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    return r.content.decode()


def test_reservation_page_says_how_it_counts(browser_for, teams, people, a100s):
    guaranteed = hold(people, teams, "alice", "vision", a100s[0], "0.5")
    borrowed = hold(people, teams, "alice", "vision", a100s[1], "0.5", admission="borrowed")
    opportunistic = hold(people, teams, "alice", "vision", a100s[2], "0.25", admission="opportunistic", priority=0)
    alice = browser_for("alice")
    html = summary(alice, guaranteed.pk)
    assert "<h2 id=\"counting-title\" class=\"counting-title\">Guaranteed</h2>" in html
    assert 'data-admission="guaranteed"' in html
    html = summary(alice, borrowed.pk)
    assert "Borrowed — may be reclaimed with 5 min warning" in html and 'data-admission="borrowed"' in html
    assert "Being reclaimed" not in html
    policy.set_policy(teams["vision"], audit.cli("test"), {"reclaim_grace_s": 600})
    assert "Borrowed — may be reclaimed with 10 min warning" in summary(alice, borrowed.pk)
    policy.set_policy(teams["vision"], audit.cli("test"), {"reclaim_grace_s": 0})
    assert "Borrowed — may be reclaimed with no warning" in summary(alice, borrowed.pk)
    html = summary(alice, opportunistic.pk)
    assert "Opportunistic — may be preempted" in html and 'data-admission="opportunistic"' in html
    # Bob, of another team, sees none of it.
    assert browser_for("bob").get(f"/reservations/{borrowed.pk}/").status_code == 404
    assert browser_for("bob").get(f"/reservations/{borrowed.pk}/", {"part": "summary"},
                                  HTTP_HX_REQUEST="true").status_code == 404


def test_a_borrowed_reservation_being_reclaimed_says_when_it_goes(browser_for, teams, people, a100s):
    borrowed = hold(people, teams, "alice", "vision", a100s[0], "0.5", admission="borrowed")
    at = timezone.now() + timedelta(minutes=5)
    services.warn_reclaim(borrowed.pk, at, "team nlp needs its quota back: reclaimed in 5 min")
    html = browser_for("alice").get(f"/reservations/{borrowed.pk}/").content.decode()
    notice = html[html.index('<div class="reclaim-notice"'):]
    notice = notice[:notice.index("</div>")]
    assert 'role="alert"' in notice and "Being reclaimed." in notice
    assert f'<time datetime="{at.isoformat()}">{at:%H:%M}</time>' in notice and "in 4 min" in notice
    assert f'data-countdown="{at.isoformat()}"' in notice
    assert "Team nlp needs its quota back" in html
    # The list shows it too.
    home = browser_for("alice").get("/").content.decode()
    card = home[home.index(f'id="reservation-{borrowed.pk}"'):]
    assert "Being reclaimed: preempted" in card[:card.index("</article>")]


def test_a_waiting_reservation_shows_its_place_and_estimate_or_why_not(browser_for, teams, people, fleet):
    waiting = submitted(people["alice"], teams["vision"], gpu_request=Decimal("1"), gpu_limit=Decimal("1"),
                        gpu_memory_mib=2048, gpu_model=A100)
    alice = browser_for("alice")
    html = summary(alice, waiting.pk)
    assert "Place in the queue" in html and "not yet known" in html and "No estimate" in html
    assert "How it counts is decided when it starts" in html and "data-admission" not in html
    services.note_pending_reason(waiting.pk, "vision holds 2.0 of its 2.0 any-model (*) GPU share quota and this "
                                             "needs 1.0; no estimate: no known end frees enough A100-80GB")
    services.set_queue_positions([(waiting.pk, 3, None)])
    html = summary(alice, waiting.pk)
    assert re.search(r'<span class="stat-label">Place in the queue</span><span class="stat-value">#3</span>', html)
    assert "No estimate" in html and "No known end frees enough A100-80GB" in html
    start = timezone.now() + timedelta(hours=2, minutes=1)
    services.set_queue_positions([(waiting.pk, 2, start)])
    html = summary(alice, waiting.pk)
    assert "#2" in html and "in 2 h" in html and "No estimate" not in html
    card = alice.get(f"/reservations/{waiting.pk}/card/").content.decode()
    assert "#2" in card and "in 2 h" in card


def test_the_reservation_list_shows_admission_badges(browser_for, teams, people, a100s):
    borrowed = hold(people, teams, "alice", "vision", a100s[0], "0.5", admission="borrowed")
    guaranteed = hold(people, teams, "alice", "vision", a100s[1], "0.5")
    waiting = submitted(people["alice"], teams["vision"], gpu_request=Decimal("0.5"), gpu_limit=Decimal("0.5"),
                        gpu_memory_mib=2048)
    html = browser_for("alice").get("/").content.decode()

    def card(r):
        found = html[html.index(f'id="reservation-{r.pk}"'):]
        return found[:found.index("</header>")]

    assert 'data-admission="borrowed"' in card(borrowed) and ">borrowed<" in card(borrowed)
    assert 'data-admission="guaranteed"' in card(guaranteed)
    assert "data-admission" not in card(waiting)  # decided when it is placed


def test_home_shows_each_teams_quota_per_model(browser_for, teams, people, a100s):
    quotas.replace_quotas(teams["vision"], audit.cli("test"), [
        {"gpu_model": A100, "gpu_share": "1", "gpu_memory_gib": "80", "gpus": 2},
        {"gpu_model": "T4", "gpu_share": "0.5", "gpu_memory_gib": "8", "gpus": 1}])
    hold(people, teams, "alice", "vision", a100s[0], "1.0")
    hold(people, teams, "alice", "vision", a100s[1], "0.5", admission="borrowed")
    hold(people, teams, "alice", "vision", a100s[2], "0.25", admission="opportunistic", priority=0)
    side = browser_for("alice").get("/home/side/").content.decode()
    assert f"<span>{A100}</span><span>1.5 of 1 GPU, 0.5 borrowed</span>" in side  # opportunistic counts in no quota
    assert "<span>T4</span><span>0 of 0.5 GPU, 0.5 left</span>" in side
    assert "quota_gpu_share" not in side
