"""Celery tasks of the telemetry app (scheduled by beat in portal/celery.py)."""

from __future__ import annotations

from celery import shared_task

from .upkeep import maintain


@shared_task(name="telemetry.maintain", ignore_result=True)
def maintain_telemetry() -> dict:
    """Per-minute rollups, raw and rollup retention, lost-node marking. Idempotent."""
    result = maintain()
    return {"rolled_up": result["rolled_up"], "lost": result["lost"]}
