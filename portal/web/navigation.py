"""The navigation bar: one registry of entries, each with who may see it.

A page module adds itself with one line, e.g.

    navigation.register("Fleet", "fleet", allowed=navigation.site_admin, order=60)

`entries_for(request)` gives the entries the signed-in user may use, in order, with the current
one marked. Who may see an entry is a hint for the menu only: every view still checks on the
server (a hidden link is not a permission).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.urls import NoReverseMatch, reverse

from portal.tenancy import roles
from portal.tenancy.models import Role

Rule = Callable[[object], bool]


def signed_in(user) -> bool:
    return user.is_authenticated


site_admin = roles.is_site_admin


def submitter(user) -> bool:
    """May request GPU shares for some team (member or team admin), or a site admin."""
    return site_admin(user) or any(r in roles.SUBMIT_ROLES for r in roles.team_roles(user).values())


def team_admin(user) -> bool:
    """Administers some team, or a site admin."""
    return site_admin(user) or Role.ADMIN in roles.team_roles(user).values()


def manager(user) -> bool:
    """Reads a team's reports: its manager or admin, or a site admin."""
    return site_admin(user) or bool({Role.ADMIN, Role.MANAGER} & set(roles.team_roles(user).values()))


@dataclass(frozen=True)
class Entry:
    label: str
    url_name: str  # a URL name, or an absolute path starting with "/"
    allowed: Rule
    order: int
    # Paths under which this entry is the current one (default: its own URL and below it; "/" only itself).
    section: str | None = None


@dataclass(frozen=True)
class Link:
    label: str
    url: str
    current: bool


_entries: dict[str, Entry] = {}


def register(label: str, url_name: str, *, allowed: Rule = signed_in, order: int = 100,
             section: str | None = None) -> None:
    """Add (or replace, by label) an entry of the navigation bar."""
    _entries[label] = Entry(label, url_name, allowed, order, section)


def unregister(label: str) -> None:
    """Remove an entry (no error when there is none)."""
    _entries.pop(label, None)


def _url(entry: Entry) -> str | None:
    if entry.url_name.startswith("/"):
        return entry.url_name
    try:
        return reverse(entry.url_name)
    except NoReverseMatch:  # the page's app is not installed here: no entry rather than a 500
        return None


def entries_for(request) -> list[Link]:
    user = request.user
    if not user.is_authenticated:
        return []
    found = []
    for entry in sorted(_entries.values(), key=lambda e: (e.order, e.label)):
        url = _url(entry)
        if url is None or not entry.allowed(user):
            continue
        section = entry.section or url
        current = request.path == url if section == "/" else request.path.startswith(section)
        found.append((entry.label, url, len(section) if current else -1))
    # One current entry: the one whose section matches the most of the path (/fleet/departments/
    # is Departments', not also Fleet's).
    best = max((n for _, _, n in found), default=-1)
    return [Link(label, url, n >= 0 and n == best) for label, url, n in found]


# The data scientist's pages (this app). Other apps register theirs in their own modules.
register("Home", "home", order=10, section="/")
register("Request GPU", "new-reservation", allowed=submitter, order=20)
# Reports (overview, usage report) register themselves in portal/reports/views.py.
# The bell in the header leads there too (portal/notifications).
register("Notifications", "notifications", order=85)
register("API", "/api/docs/", order=90)
register("Django admin", "/admin/", allowed=site_admin, order=95)
