"""The periodic upkeep of telemetry (Celery beat's `telemetry.maintain`, or the in-process ticker
when there is no beat): roll up and expire the rows (rollups.py), and mark lost the nodes whose
agents fell silent (their last_seen, which the agents' batches move, is older than
TESSERA_NODE_LOST_AFTER_S; fleet.services.mark_lost_nodes does the marking and its effects)."""

from __future__ import annotations

import logging
from datetime import datetime

from portal.fleet import services as fleet_services

from . import conf
from .rollups import apply_retention, roll_up

log = logging.getLogger(__name__)


def mark_silent_nodes_lost() -> list[str]:
    """The names of the nodes marked lost now because their agents fell silent."""
    lost = fleet_services.mark_lost_nodes(conf.node_lost_after())
    if lost:
        log.warning("nodes marked lost (agent silent): %s", ", ".join(lost))
    return lost


def maintain(now: datetime | None = None) -> dict:
    """One round of telemetry upkeep: rollups, retention, lost nodes."""
    rolled = roll_up(now)
    deleted = apply_retention(now)
    return {"rolled_up": rolled, "deleted": deleted, "lost": mark_silent_nodes_lost()}
