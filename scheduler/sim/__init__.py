"""Trace replay of the placement engine (Alibaba GPU trace, FGD's experiment): `python -m scheduler.sim`."""
