"""`/metrics` in the Prometheus text format, computed from the database at scrape time.

GPU series use the names and labels of NVIDIA's DCGM exporter (DCGM_FI_DEV_GPU_UTIL with `gpu`,
`UUID`, `modelName`, `Hostname`), so dashboards made for it work; the rest is `tessera_*`.
Memory is in MiB, as DCGM reports framebuffer memory.
"""

from __future__ import annotations

from collections import defaultdict

from django.db.models import F
from prometheus_client.core import GaugeMetricFamily

from portal.fleet.models import Gpu, Node, NodeStatus
from portal.reservations.models import Allocation

from .services import latest_gpu_readings, latest_share_readings

_GPU_LABELS = ["gpu", "UUID", "modelName", "Hostname"]


class TelemetryCollector:
    def collect(self):
        gpus = {g.pk: g for g in Gpu.objects.select_related("node")}
        readings = latest_gpu_readings()
        util = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", labels=_GPU_LABELS)
        mem_util = GaugeMetricFamily("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).",
                                     labels=_GPU_LABELS)
        fb_used = GaugeMetricFamily("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).",
                                    labels=_GPU_LABELS)
        fb_free = GaugeMetricFamily("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).",
                                    labels=_GPU_LABELS)
        power = GaugeMetricFamily("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", labels=_GPU_LABELS)
        temp = GaugeMetricFamily("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", labels=_GPU_LABELS)
        for gpu_id, r in sorted(readings.items()):
            gpu = gpus.get(gpu_id)
            if gpu is None:
                continue
            labels = [str(gpu.index), gpu.uuid, gpu.model, gpu.node.name]
            if r["sm_util_pct"] is not None:
                util.add_metric(labels, r["sm_util_pct"])
            if r["mem_util_pct"] is not None:
                mem_util.add_metric(labels, r["mem_util_pct"])
            fb_used.add_metric(labels, r["mem_used_mib"])
            fb_free.add_metric(labels, max(0, gpu.memory_mib - r["mem_used_mib"]))
            if r["power_w"] is not None:
                power.add_metric(labels, r["power_w"])
            if r["temp_c"] is not None:
                temp.add_metric(labels, r["temp_c"])
        yield from (util, mem_util, fb_used, fb_free, power, temp)

        allocations = list(
            Allocation.objects.filter(released_at__isnull=True)
            .values("reservation_id", "gpu_id", "gpu_request", "gpu_limit", "gpu_memory_mib",
                    team=F("reservation__team__slug"))
        )
        used = latest_share_readings({a["reservation_id"] for a in allocations})
        share_labels = ["reservation", "team", "UUID", "Hostname"]
        alloc = GaugeMetricFamily("tessera_share_allocated_fraction",
                                  "Guaranteed fraction of the GPU placed for the share.", labels=share_labels)
        limit = GaugeMetricFamily("tessera_share_limit_fraction",
                                  "Most of the GPU the share may use when it is idle.", labels=share_labels)
        used_g = GaugeMetricFamily("tessera_share_used_fraction",
                                   "Fraction of the GPU the share used over the last interval.",
                                   labels=share_labels)
        mem_alloc = GaugeMetricFamily("tessera_share_memory_allocated_mib", "Memory cap of the share (MiB).",
                                      labels=share_labels)
        mem_used = GaugeMetricFamily("tessera_share_memory_used_mib", "Memory the share holds (MiB).",
                                     labels=share_labels)
        team_alloc: dict[str, float] = defaultdict(float)
        team_used: dict[str, float] = defaultdict(float)
        team_mem: dict[str, float] = defaultdict(float)
        for a in allocations:
            gpu = gpus.get(a["gpu_id"])
            if gpu is None:
                continue
            labels = [str(a["reservation_id"]), a["team"], gpu.uuid, gpu.node.name]
            alloc.add_metric(labels, float(a["gpu_request"]))
            limit.add_metric(labels, float(a["gpu_limit"]))
            mem_alloc.add_metric(labels, a["gpu_memory_mib"])
            team_alloc[a["team"]] += float(a["gpu_request"])
            reading = used.get((a["reservation_id"], a["gpu_id"]))
            if reading is not None:
                used_g.add_metric(labels, reading["used_frac"])
                team_used[a["team"]] += reading["used_frac"]
                if reading["mem_used_mib"] is not None:
                    mem_used.add_metric(labels, reading["mem_used_mib"])
                    team_mem[a["team"]] += reading["mem_used_mib"]
        yield from (alloc, limit, used_g, mem_alloc, mem_used)

        t_alloc = GaugeMetricFamily("tessera_team_allocated_gpu_fraction",
                                    "Sum of the team's guaranteed GPU fractions placed now.", labels=["team"])
        t_used = GaugeMetricFamily("tessera_team_used_gpu_fraction",
                                   "Sum of what the team's shares used over the last interval.", labels=["team"])
        t_mem = GaugeMetricFamily("tessera_team_memory_used_mib", "Memory the team's shares hold (MiB).",
                                  labels=["team"])
        for team in sorted(team_alloc):
            t_alloc.add_metric([team], round(team_alloc[team], 4))
            t_used.add_metric([team], round(team_used[team], 4))
            t_mem.add_metric([team], team_mem[team])
        yield from (t_alloc, t_used, t_mem)

        nodes = GaugeMetricFamily("tessera_node_up", "1 while the node's agent reports and it is not lost.",
                                  labels=["Hostname", "status"])
        seen = GaugeMetricFamily("tessera_node_last_seen_seconds", "Unix time of the agent's last report.",
                                 labels=["Hostname"])
        for node in Node.objects.all():
            nodes.add_metric([node.name, node.status], 0 if node.status == NodeStatus.LOST else 1)
            if node.last_seen is not None:
                seen.add_metric([node.name], node.last_seen.timestamp())
        yield from (nodes, seen)
