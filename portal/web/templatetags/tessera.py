"""Template helpers of the foundation: the navigation, human units, state tones, team colours."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from .. import navigation

register = template.Library()

# Okabe & Ito's palette: told apart with every common colour-vision deficiency. Black is left
# out (it vanishes in the dark theme); each colour also comes with the team's name, never alone.
TEAM_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442")

# A state's tone names its meaning for the badge colour; the word is always shown with it.
STATE_TONES = {
    "pending": "wait", "placed": "info", "running": "ok", "succeeded": "done", "failed": "bad",
    "cancelled": "done", "preempted": "warn", "expired": "done",
}


@register.simple_tag(takes_context=True)
def nav_links(context) -> list[navigation.Link]:
    request = context.get("request")
    return navigation.entries_for(request) if request is not None else []


@register.filter
def team_colour(team) -> str:
    """A stable colour per team (by id): the same team has the same colour on every page."""
    team_id = getattr(team, "pk", team)
    try:
        return TEAM_COLOURS[int(team_id) % len(TEAM_COLOURS)]
    except (TypeError, ValueError):
        return TEAM_COLOURS[0]


@register.filter
def team_class(team) -> str:
    """The CSS class of the team's colour (.team-c0 …): classes, not inline styles, for the CSP."""
    team_id = getattr(team, "pk", team)
    try:
        return f"team-c{int(team_id) % len(TEAM_COLOURS)}"
    except (TypeError, ValueError):
        return "team-c0"


@register.filter
def chart_table_rows(chart: dict) -> str:
    """The <tr> rows of a chart's number table (local time, a value per series), newest first.
    Built here rather than by a template loop: a chart over 30 days has hundreds of rows."""
    xs = chart.get("x", [])
    series = [s["values"] for s in chart.get("series", [])]
    span = (xs[-1] - xs[0]) if len(xs) > 1 else 0
    fmt = "%Y-%m-%d %H:%M" if span > 86400 else "%H:%M:%S"
    tz = timezone.get_current_timezone()
    out = []
    for i in range(len(xs) - 1, -1, -1):
        cells = "".join('<td class="num">' + ("" if i >= len(v) or v[i] is None else f"{v[i]:g}") + "</td>"
                        for v in series)
        out.append(f"<tr><td>{datetime.fromtimestamp(xs[i], tz=tz).strftime(fmt)}</td>{cells}</tr>")
    return mark_safe("".join(out))  # noqa: S308 (numbers and dates formatted here, nothing from users)


@register.simple_tag
def badge(state: str, label: str = "") -> str:
    """The state badge (as components/badge.html), as a tag: cheaper in long lists."""
    return format_html('<span class="badge tone-{}">{}</span>', state_tone(state), label or state)


# How a reservation counts against quotas (reservations.models.Admission): tone and words.
ADMISSION_TONES = {"guaranteed": "ok", "borrowed": "warn", "opportunistic": "wait"}
ADMISSION_TITLES = {
    "guaranteed": "within its team's quota",
    "borrowed": "beyond its team's quota, from what others lend: may be reclaimed",
    "opportunistic": "on idle capacity, counted in no quota: may be preempted",
}


@register.simple_tag
def admission_badge(reservation) -> str:
    """How a reservation that holds (or held) GPUs counts, as a badge with its meaning in words;
    nothing for one that waits (how it counts is decided when it is placed)."""
    if reservation.state == "pending" or reservation.placed_at is None:
        return ""
    admission = str(reservation.admission)
    return format_html('<span class="badge admission tone-{}" data-admission="{}"><span class="visually-hidden">'
                       "counts as </span>{}<span class=\"visually-hidden\">: {}</span></span>",
                       ADMISSION_TONES.get(admission, "info"), admission, admission,
                       ADMISSION_TITLES.get(admission, ""))


@register.filter
def warning_text(seconds) -> str:
    """A reclaim's warning in words: "5 min", or "no" for none."""
    return human_duration(float(seconds)) if seconds else "no"


@register.filter
def estimate_reason(reservation) -> str:
    """Why a waiting reservation has no estimated start, from its state reason ("no estimate: …")."""
    text = reservation.state_reason or ""
    at = text.lower().find("no estimate")
    if at < 0:
        return ""
    reason = text[at + len("no estimate"):].lstrip(":; ,")
    return reason[:1].upper() + reason[1:] if reason else ""


@register.simple_tag
def team_name(team) -> str:
    """The team with its colour (as components/team.html), as a tag: cheaper in long lists."""
    return format_html('<span class="team {}">{}</span>', team_class(team), team.name or team.slug)


@register.filter
def state_tone(state: str) -> str:
    return STATE_TONES.get(str(state), "info")


@register.filter
def gib(mib) -> str:
    """MiB → "12 GiB" / "1.5 GiB" / "512 MiB"."""
    if mib in (None, ""):
        return ""
    mib = int(mib)
    if mib < 1024:
        return f"{mib} MiB"
    value = mib / 1024
    return f"{value:.0f} GiB" if value == int(value) or value >= 100 else f"{value:.1f} GiB"


@register.filter
def share(value) -> str:
    """A GPU fraction as people say it: 0.5 → "0.5", 0.250 → "0.25", 1 → "1"."""
    if value in (None, ""):
        return ""
    text = f"{Decimal(value):.3f}".rstrip("0").rstrip(".")
    return text or "0"


@register.filter
def percent(value, digits: int = 0) -> str:
    if value in (None, ""):
        return ""
    return f"{float(value) * 100:.{int(digits)}f} %"


def human_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min"
    return f"{secs} s"


@register.filter
def duration(value) -> str:
    """Seconds (or a timedelta) → "2 h 5 min"."""
    if value in (None, ""):
        return ""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    return human_duration(float(value))


@register.filter
def since(moment: datetime | None) -> str:
    """How long ago: "5 min"."""
    return human_duration((timezone.now() - moment).total_seconds()) if moment else ""


@register.filter
def until(moment: datetime | None) -> str:
    """How long from now: "in 5 min" / "5 min ago"."""
    if moment is None:
        return ""
    delta = (moment - timezone.now()).total_seconds()
    return f"in {human_duration(delta)}" if delta >= 0 else f"{human_duration(-delta)} ago"


@register.filter
def idle_reclaim_at(reservation) -> datetime | None:
    """When an idle reservation is reclaimed if it stays idle (None: not idle, or warn only)."""
    from portal.reservations.services import idle_reclaim_at as reclaim_at

    return reclaim_at(reservation.idle_since, reservation.team)


@register.filter
def lost_nodes(reservation) -> list:
    """The nodes under a reservation that the portal holds lost: its GPUs' node, and for a remote
    share the node its pod runs on."""
    from portal.fleet.models import NodeStatus

    nodes = [reservation.node] + ([reservation.client_node] if reservation.sharing == "remote" else [])
    return [n for n in nodes if n is not None and n.status == NodeStatus.LOST]
