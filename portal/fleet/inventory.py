"""Load a YAML fleet inventory into nodes and GPUs. The file format is the one the simulated agent
reads (wire/PROTOCOL.md), parsed by the same code so a simulated GPU has one UUID everywhere."""

from __future__ import annotations

from pathlib import Path

from wire.inventory import InventoryError, load_inventory

from . import services

__all__ = ["InventoryError", "load"]


def load(path: str | Path) -> tuple[int, int]:
    """Validate the whole file first, then write it in one transaction. Returns (nodes, gpus)."""
    nodes = load_inventory(path)
    return services.apply_inventory([
        {
            "name": node.name,
            "labels": node.labels,
            "cpu_milli": 0,
            "memory_mib": 0,
            "gpus": [
                {"uuid": g.uuid, "index": g.index, "model": g.model, "memory_mib": g.memory_mib,
                 "nvlink_peers": list(g.nvlink_peers), "numa_node": g.numa_node}
                for g in node.gpus
            ],
        }
        for node in nodes
    ])
