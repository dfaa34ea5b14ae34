"""Who wants which event on which channel. Defaults: everything in the portal; by e-mail what a
person acts on or would miss (running, finished, failed, reclaim, node lost, maintenance over a
booking); no webhook."""

from __future__ import annotations

from .models import Channel, Event, Preferences

DEFAULTS: dict[str, frozenset[str]] = {
    event: frozenset({Channel.IN_APP} | ({Channel.EMAIL} if event in (
        Event.RUNNING, Event.FINISHED, Event.FAILED, Event.RECLAIM, Event.NODE_LOST, Event.DRAIN) else set()))
    for event in Event.values
}
DEFAULT_WAITING_AFTER_MIN = 15
WAITING_AFTER_RANGE = (1, 1440)  # a minute to a day


def of(user_ids) -> dict[int, Preferences]:
    """Each person's preferences (an unsaved default row for those who never changed them)."""
    ids = set(user_ids)
    found = {p.user_id: p for p in Preferences.objects.filter(user_id__in=ids)}
    return {uid: found.get(uid) or Preferences(user_id=uid) for uid in ids}


def channels_for(prefs: Preferences, event: str) -> frozenset[str]:
    chosen = (prefs.channels or {}).get(event)
    if chosen is None:
        return DEFAULTS[event]
    return frozenset(c for c in chosen if c in Channel.values)


def save(user, channels: dict[str, set[str]], waiting_after_min: int, webhook_url: str) -> Preferences:
    """The one writer of a person's preferences (the settings page validated the input)."""
    prefs, _ = Preferences.objects.get_or_create(user=user)
    prefs.channels = {event: sorted(channels.get(event, set())) for event in Event.values}
    prefs.waiting_after_min = waiting_after_min
    prefs.webhook_url = webhook_url
    prefs.save()
    return prefs
