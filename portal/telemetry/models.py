"""GPU telemetry: agent streams, raw samples (kept short) and per-minute rollups (kept long).

Raw rows are one GPU (or one share) at one sampling instant; they live about an hour. The
per-minute rollups keep sums and counts rather than averages, so a month of minutes can be
re-aggregated exactly into hours or days by a report.
"""

from __future__ import annotations

from django.db import models

from portal.fleet.models import Gpu, Node
from portal.reservations.models import Reservation


class AgentStream(models.Model):
    """One agent process's numbered sample stream. `last_seq` is the highest seq stored: the
    idempotency key of ingestion (a sample with seq ≤ last_seq is a replay and is skipped)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="agent_streams")
    stream = models.UUIDField()
    agent_version = models.CharField(max_length=32)
    source = models.CharField(max_length=16)
    interval_ms = models.PositiveIntegerField()
    last_seq = models.BigIntegerField(default=0)
    dropped = models.BigIntegerField(default=0, help_text="Samples the agent dropped before they were stored")
    last_sample_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "stream"], name="unique_stream_per_node")]

    def __str__(self) -> str:
        return f"{self.node_id}/{self.stream} @{self.last_seq}"


class GpuSample(models.Model):
    """One GPU at one sampling instant (raw, short retention). Thousands of rows a second: no
    index the (gpu, ts) one already covers (every index is work on every row)."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="+", db_index=False)
    stream = models.ForeignKey(AgentStream, on_delete=models.CASCADE, related_name="+")
    seq = models.BigIntegerField()
    ts = models.DateTimeField()
    sm_util_pct = models.SmallIntegerField(null=True)
    mem_util_pct = models.SmallIntegerField(null=True)
    mem_used_mib = models.IntegerField()
    power_w = models.FloatField(null=True)
    temp_c = models.SmallIntegerField(null=True)

    class Meta:
        indexes = [models.Index(fields=["gpu", "ts"]), models.Index(fields=["ts"])]

    def __str__(self) -> str:
        return f"gpu {self.gpu_id} @{self.ts:%H:%M:%S}"


class ShareSample(models.Model):
    """What one placed share really used on one GPU at one sampling instant (raw). The
    (reservation, ts) index serves lookups by reservation."""

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="+", db_index=False)
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="+")
    ts = models.DateTimeField()
    used_frac = models.FloatField()
    mem_used_mib = models.IntegerField(null=True)

    class Meta:
        indexes = [models.Index(fields=["reservation", "ts"]), models.Index(fields=["ts"])]

    def __str__(self) -> str:
        return f"reservation {self.reservation_id} on gpu {self.gpu_id} @{self.ts:%H:%M:%S}"


class GpuMinute(models.Model):
    """Per-minute rollup of one GPU: sums and counts (averages are sum / count)."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="+")
    minute = models.DateTimeField()
    samples = models.IntegerField()
    sm_util_sum = models.BigIntegerField(help_text="Sum of sm_util_pct over the samples that had it")
    sm_util_count = models.IntegerField()
    sm_util_max = models.SmallIntegerField(null=True)
    mem_used_sum = models.BigIntegerField()
    mem_used_max = models.IntegerField()
    power_sum = models.FloatField()
    power_count = models.IntegerField()
    temp_max = models.SmallIntegerField(null=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["gpu", "minute"], name="unique_gpu_minute")]
        indexes = [models.Index(fields=["minute"])]

    def __str__(self) -> str:
        return f"gpu {self.gpu_id} {self.minute:%Y-%m-%d %H:%M}"


class ShareMinute(models.Model):
    """Per-minute rollup of one share on one GPU."""

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="+")
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="+")
    team_id = models.BigIntegerField(db_index=True, help_text="The reservation's team, for team reports")
    minute = models.DateTimeField()
    samples = models.IntegerField()
    used_sum = models.FloatField()
    used_max = models.FloatField()
    mem_used_max = models.IntegerField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["reservation", "gpu", "minute"], name="unique_share_minute")
        ]
        indexes = [models.Index(fields=["minute"]), models.Index(fields=["reservation", "minute"])]

    def __str__(self) -> str:
        return f"reservation {self.reservation_id} on gpu {self.gpu_id} {self.minute:%Y-%m-%d %H:%M}"


class ShareHour(models.Model):
    """One share on one GPU over one hour, folded from its minutes for reports over weeks: a
    30-day report reads 720 rows per share instead of 43,200. Every sum is in GPU-minutes, each
    minute weighted by the part of it that has samples (as ShareMinute is read). Idle and burst are
    judged per minute, with the team's idle threshold and the share's request of that moment."""

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="+")
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="+")
    team_id = models.BigIntegerField(help_text="The reservation's team, for team reports")
    hour = models.DateTimeField()
    sampled_minutes = models.FloatField(help_text="Minutes with samples (a half-sampled minute counts 0.5)")
    used = models.FloatField(help_text="GPU-minutes used")
    idle_allocated = models.FloatField(help_text="Allocated GPU-minutes in minutes used under the idle threshold")
    over_request = models.FloatField(help_text="GPU-minutes used above the share's request (burst)")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["reservation", "gpu", "hour"], name="unique_share_hour")]
        indexes = [models.Index(fields=["hour"])]

    def __str__(self) -> str:
        return f"reservation {self.reservation_id} on gpu {self.gpu_id} {self.hour:%Y-%m-%d %H}h"


class GpuHour(models.Model):
    """One GPU over one hour, folded from its minutes: device busy GPU-minutes (mean SM use)."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField()
    sampled_minutes = models.FloatField()
    busy = models.FloatField(help_text="GPU-minutes the device was busy (SM utilization)")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["gpu", "hour"], name="unique_gpu_hour")]
        indexes = [models.Index(fields=["hour"])]

    def __str__(self) -> str:
        return f"gpu {self.gpu_id} {self.hour:%Y-%m-%d %H}h"


class GpuDay(models.Model):
    """One GPU over one UTC day, folded from its hours: a month's device load for 4,000 GPUs is
    120,000 rows instead of 2.9 million (site admins' node and model reports read it)."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="+")
    day = models.DateTimeField(help_text="00:00 UTC of the day")
    sampled_minutes = models.FloatField()
    busy = models.FloatField(help_text="GPU-minutes the device was busy (SM utilization)")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["gpu", "day"], name="unique_gpu_day")]
        indexes = [models.Index(fields=["day"])]

    def __str__(self) -> str:
        return f"gpu {self.gpu_id} {self.day:%Y-%m-%d}"


class LateMinute(models.Model):
    """A minute that got samples after it was rolled up (a replay after an outage): the next
    rollup recomputes it from the raw rows."""

    minute = models.DateTimeField(unique=True)

    def __str__(self) -> str:
        return f"late {self.minute:%Y-%m-%d %H:%M}"


class RollupState(models.Model):
    """Singleton: every minute before `rolled_up_to` has been rolled up."""

    rolled_up_to = models.DateTimeField(null=True)
    # Every hour before this has been folded into ShareHour and GpuHour (None: none yet).
    hours_rolled_up_to = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return f"rolled up to {self.rolled_up_to}"
