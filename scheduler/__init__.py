"""Tessera's scheduler: the placement engine (core), cluster backends, and trace replay (sim)."""
