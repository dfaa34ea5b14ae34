"""Who may open a reservation's app, the app's token, and what the pod is told about its app.

The token is derived, not stored: an HMAC of the reservation id under the portal's secret key, so
the bind task (which puts it in the pod's environment) and the proxy (which adds it to each
request it forwards) compute the same value and no row holds it. Nobody but the portal and the
pod ever sees it: the proxy adds it on the way in and the browser never gets it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from django.conf import settings
from django.utils.crypto import salted_hmac

from portal.reservations.models import Reservation
from portal.reservations.states import State
from portal.tenancy import roles
from portal.tenancy.policy import policy_of

PREFIX = "/connect/"


def base_url(reservation_id: int) -> str:
    """Where the app is served on the portal's origin (and the path prefix the app must serve under)."""
    return f"{PREFIX}{reservation_id}/"


def app_token(reservation_id: int) -> str:
    return _app_token(settings.SECRET_KEY, reservation_id)


@functools.lru_cache(maxsize=4096)
def _app_token(secret: str, reservation_id: int) -> str:
    # Kept: the proxy adds it to every request it forwards and masks it in every answer.
    return salted_hmac("tessera.connect.app-token", str(reservation_id), secret=secret,
                       algorithm="sha256").hexdigest()


def app_env(reservation_id: int, app: str, port: int | None) -> dict[str, str]:
    """The pod's variables for its app (none without one). An image that is not a stock Jupyter one
    starts its app with them (`--ServerApp.token`, `--path_prefix`, …)."""
    if not app or port is None:
        return {}
    env = {"TESSERA_APP": app, "TESSERA_APP_PORT": str(port), "TESSERA_APP_TOKEN": app_token(reservation_id),
           "TESSERA_APP_BASE_URL": base_url(reservation_id)}
    if app == "jupyter":
        # What a stock Jupyter image reads without a command of its own: jupyter-server takes its
        # token and port from JUPYTER_TOKEN and JUPYTER_PORT, the Jupyter Docker Stacks' start
        # script adds NOTEBOOK_ARGS to its command line (the base URL).
        env |= {"JUPYTER_TOKEN": env["TESSERA_APP_TOKEN"], "JUPYTER_PORT": str(port),
                "NOTEBOOK_ARGS": f"--ServerApp.base_url={base_url(reservation_id)}"}
    return env


@dataclass(frozen=True)
class Target:
    """A reservation whose app the user may open now."""

    reservation_id: int
    app: str
    port: int
    pod_namespace: str
    pod_name: str
    owner_id: int


def may_open(user, reservation: Reservation) -> bool:
    """The owner; a team admin where the team's policy lets admins open members' apps. Not site
    admins as such: an app is someone's workspace."""
    if not user.is_authenticated or not user.is_active:
        return False
    if reservation.owner_id == user.pk:
        return True
    return roles.role_in(user, reservation.team_id) == roles.Role.ADMIN and policy_of(reservation.team).connect_admins


def target_for(user, reservation_id: int) -> Target | None:
    """The app `user` may open for `reservation_id` now, or None: not theirs to open, no app, or
    not running (all the same to the caller: a 404)."""
    reservation = (Reservation.objects.select_related("team", "team__policy")
                   .filter(pk=reservation_id, state=State.RUNNING).exclude(app="").first())
    if reservation is None or reservation.app_port is None or not reservation.pod_name:
        return None
    if not may_open(user, reservation):
        return None
    return Target(reservation.pk, reservation.app, reservation.app_port, reservation.pod_namespace,
                  reservation.pod_name, reservation.owner_id)


@dataclass(frozen=True)
class Link:
    """The reservation page's Open button: where it leads, what it opens, whether it works yet."""

    url: str
    app: str
    label: str
    ready: bool  # running; else the page says it opens once the pod runs


def link_for(user, reservation: Reservation) -> Link | None:
    """The Open button for `user`, or None: no app, ended, or not theirs to open."""
    from .kinds import ENTRY_PATHS, AppKind

    if not reservation.app or reservation.state not in (State.PENDING, State.PLACED, State.RUNNING):
        return None
    if not may_open(user, reservation):
        return None
    return Link(url=base_url(reservation.pk) + ENTRY_PATHS.get(reservation.app, ""), app=reservation.app,
                label=AppKind(reservation.app).label, ready=reservation.state == State.RUNNING)
