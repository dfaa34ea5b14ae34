"""Share tokens of remote GPU shares live as long as their reservation, plus a stated slack: a
one-minute reservation does not buy a month of GPU time on the node's remote server."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from portal.audit import services as audit
from portal.fleet.models import Gpu
from portal.placement import share_tokens
from portal.tenancy import policy
from scheduler.backends import GpuShare
from tests.reservations import placed, submitted
from wire import share_tokens as tokens

pytestmark = pytest.mark.django_db

SECRET = b"t4-node-1 secret, 32 bytes long.."


@pytest.fixture
def secrets_dir(settings, tmp_path):
    (tmp_path / "t4-node-1").write_bytes(SECRET)
    settings.TESSERA_REMOTE_SECRETS_DIR = str(tmp_path)


def _token_of(reservation, gpu) -> str:
    share = GpuShare(uuid=gpu.uuid, index=gpu.index, gpu_request=0.25, gpu_limit=0.25, gpu_memory_mib=1024)
    env = share_tokens.remote_env(str(reservation.pk), reservation.attempt, "t4-node-1", None, share, 50)
    return env["TESSERA_REMOTE_TOKEN"]


def test_the_token_lives_as_long_as_a_member_may_extend_the_reservation_plus_the_slack(
        fleet, people, teams, secrets_dir):
    # a one-minute reservation of a team whose members may extend to at most two hours
    policy.set_policy(teams["vision"], audit.cli("test"), {"max_duration_s": 7200, "interactive_max_s": 3600})
    gpu = Gpu.objects.filter(node__name="t4-node-1").order_by("index").first()
    r = placed(submitted(people["alice"], teams["vision"], gpu_request=Decimal("0.25"), gpu_memory_mib=1024,
                         max_duration_s=60), gpu)
    assert r.expires_at is not None
    token = _token_of(r, gpu)
    _terms, expires = tokens.verify(SECRET, token)
    longest = r.placed_at.timestamp() + 7200
    assert expires == pytest.approx(longest + share_tokens.EXPIRY_SLACK_S, abs=2)
    # The server's check: refused once the longest extension and the slack have passed, not a month later.
    with pytest.raises(tokens.TokenError, match="expired"):
        tokens.verify(SECRET, token, now=longest + share_tokens.EXPIRY_SLACK_S + 1)


def test_a_reservation_without_an_end_gets_the_bounded_lifetime(fleet, people, teams, secrets_dir, settings):
    settings.TESSERA_REMOTE_TOKEN_TTL_S = 3600
    gpu = Gpu.objects.filter(node__name="t4-node-1").order_by("index").first()
    r = placed(submitted(people["alice"], teams["vision"], gpu_request=Decimal("0.25"), gpu_memory_mib=1024), gpu)
    assert r.expires_at is None
    _terms, expires = tokens.verify(SECRET, _token_of(r, gpu))
    assert expires == pytest.approx(time.time() + 3600, abs=5)


def test_ttl_is_never_below_the_slack():
    from datetime import UTC, datetime

    past = datetime(2020, 1, 1, tzinfo=UTC)
    assert share_tokens.token_ttl_s(past) == share_tokens.EXPIRY_SLACK_S
