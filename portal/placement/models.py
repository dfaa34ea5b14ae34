"""The placement fence: the highest fencing token whose holder has committed a decision.

A cycle commits each decision only if its token is at least this high (and raises it): a cycle
that lost its lock (paused, expired, partitioned) can never write after a newer holder has.
"""

from django.db import models


class Fence(models.Model):
    # One row per cluster; the portal manages one cluster.
    accepted = models.BigIntegerField(default=0, help_text="Highest token that committed")
    issued = models.BigIntegerField(default=0, help_text="Last token handed out without Redis")

    def __str__(self) -> str:
        return f"fence {self.accepted}"
