"""Telemetry settings with their defaults; override them in portal/settings.py (from the environment)."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings


def _get(name: str, default):
    return getattr(settings, name, default)


def raw_retention() -> timedelta:
    """How long raw per-second samples are kept (the per-minute rollups outlive them)."""
    return timedelta(seconds=_get("TESSERA_TELEMETRY_RAW_RETENTION_S", 3600))


def minute_retention() -> timedelta:
    return timedelta(days=_get("TESSERA_TELEMETRY_MINUTE_RETENTION_DAYS", 90))


def hour_retention() -> timedelta:
    """The hourly rollups outlive the minutes: reports may span up to 400 days."""
    return timedelta(days=_get("TESSERA_TELEMETRY_HOUR_RETENTION_DAYS", 400))


def node_lost_after() -> timedelta:
    """A node whose agent has been silent this long is marked lost."""
    return timedelta(seconds=_get("TESSERA_NODE_LOST_AFTER_S", 90))


def agent_rate() -> tuple[float, int]:
    """Per-connection token bucket (messages per second, burst) on ws/agents/. The protocol asks
    for at least 10/s and 20; an agent keeps to 5/s and 10."""
    return (float(_get("TESSERA_AGENT_MAX_MESSAGES_PER_S", 20.0)), int(_get("TESSERA_AGENT_MAX_BURST", 40)))


def max_future_skew() -> timedelta:
    """Samples stamped further than this in the future are refused (a broken agent clock)."""
    return timedelta(seconds=_get("TESSERA_TELEMETRY_MAX_FUTURE_S", 300))


def writer_delay_s() -> float:
    """How long the ingest writer gathers batches from all connections before one commit."""
    return float(_get("TESSERA_TELEMETRY_WRITE_DELAY_S", 0.05))


def live_publish_every_s() -> float:
    """Live fan-out publishes at most this often per portal process (readings in between are
    merged, the newest per node)."""
    return float(_get("TESSERA_TELEMETRY_LIVE_EVERY_S", 0.1))


def metrics_token() -> str:
    return str(_get("TESSERA_METRICS_TOKEN", ""))
