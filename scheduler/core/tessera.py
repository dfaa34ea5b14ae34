"""Tessera's default policy (placeholder until measured: FGD's rule)."""

from __future__ import annotations

from .fragmentation import FgdScorer


class TesseraScorer(FgdScorer):
    name = "tessera"
