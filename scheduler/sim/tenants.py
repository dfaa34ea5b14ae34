"""A synthetic multi-tenant GPU trace: departments, teams with skewed demand, jobs arriving over time.

Deterministic per seed. The fleet is a few pools of one GPU model each. Teams sit under
departments and ask for their preferred model most of the time; each team's share of the demand
follows a Zipf law (`skew`), and its arrivals follow a day cycle with its own phase, so teams peak
at different hours. The arrival rate is set so that the GPU-seconds asked for are `load` times
what the fleet holds over the horizon (1.3: 130%).

Jobs are fractional (a quarter or half of a GPU), one whole GPU, or 2, 4 or 8 whole GPUs on one
node. Interactive jobs have a maximum duration (the reservation's length, so their end is known
while they run) and end at it or before; batch jobs run for a lognormal time that nobody knows in
advance. A share of the jobs is priority 0 (opportunistic); the rest have priority 1, 2 or 5.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from scheduler.core.model import Gpu, Node, Request

HOUR = 3600.0
DAY = 24 * HOUR


@dataclass(frozen=True)
class Pool:
    """Nodes of one GPU model."""

    model: str
    nodes: int
    gpus_per_node: int
    memory_mib: int  # per GPU
    cpu_milli_per_gpu: int = 8000
    memory_mib_per_gpu: int = 65536  # host memory


DEFAULT_POOLS = (
    Pool("A100", 6, 8, 40960),
    Pool("V100", 6, 4, 32768),
    Pool("T4", 12, 2, 15360),
)

DEPARTMENT_NAMES = ("research", "product", "platform", "operations", "finance", "legal")


@dataclass(frozen=True)
class Department:
    name: str  # slug
    parent: str | None = None


@dataclass(frozen=True)
class TeamSpec:
    name: str  # slug
    department: str
    demand: float  # its share of all demand (the teams' sum to 1)
    model: str  # the GPU model it asks for most
    quota_gpus: float  # a flat quota: the fleet's GPUs split evenly (what the portal's teams have today)
    phase_h: float  # hour of the day its arrivals peak


@dataclass(frozen=True)
class Job:
    id: str
    team: str
    arrival: float  # seconds from the start of the trace
    duration: float  # how long it runs once started (a preempted job runs it again from the start)
    max_duration: float | None  # interactive: the reservation's length (its end is known); None: batch
    gpu_request: float
    gpu_count: int
    gpu_model: str | None
    gpu_memory_mib: int
    priority: int
    cpu_milli: int
    memory_mib: int

    @property
    def interactive(self) -> bool:
        return self.max_duration is not None

    @property
    def gpu_seconds(self) -> float:
        return self.gpu_request * self.gpu_count * self.duration

    def request(self) -> Request:
        """The engine's request for this job (created when it arrived)."""
        return Request(
            id=self.id, team=self.team, gpu_request=self.gpu_request, gpu_count=self.gpu_count,
            gpu_model=self.gpu_model, gpu_memory_mib=self.gpu_memory_mib, priority=self.priority,
            created_at=self.arrival, cpu_milli=self.cpu_milli, memory_mib=self.memory_mib,
        )


@dataclass(frozen=True)
class TenantConfig:
    seed: int = 0
    departments: int = 3
    teams: int = 12
    load: float = 1.3  # GPU-seconds asked for / GPU-seconds the fleet holds, over the horizon
    horizon_s: float = 2 * DAY  # arrivals come within [0, horizon)
    pools: tuple[Pool, ...] = DEFAULT_POOLS
    scale: int = 1  # every pool's node count times this
    skew: float = 1.0  # Zipf exponent of the teams' demand (0: equal)
    interactive: float = 0.5  # share of jobs with a maximum duration (a known end)
    opportunistic: float = 0.15  # share of jobs at priority 0
    any_model: float = 0.2  # share of jobs that take any model
    other_model: float = 0.1  # share that ask for a model other than their team's
    day_swing: float = 0.5  # arrivals per team vary by +-this over the day
    # An interactive job runs min(1, lognormal(log early_median, early_sigma)) of its maximum
    # duration (many stop before their reservation expires); 1 and 0: every one runs to the end.
    early_median: float = 0.7
    early_sigma: float = 0.5
    batch_median_h: float = 3.0
    batch_sigma: float = 1.0
    batch_max_h: float = 48.0

    def __post_init__(self) -> None:
        if not 1 <= self.departments <= len(DEPARTMENT_NAMES):
            raise ValueError(f"departments must be 1..{len(DEPARTMENT_NAMES)}")
        if self.teams < self.departments:
            raise ValueError("every department needs a team: teams >= departments")
        if self.load <= 0 or self.horizon_s <= 0 or self.scale < 1:
            raise ValueError("load and horizon_s must be positive, scale at least 1")
        for name in ("interactive", "opportunistic", "any_model", "other_model", "day_swing"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be within 0..1")


@dataclass(frozen=True)
class TenantTrace:
    config: TenantConfig
    nodes: tuple[Node, ...]
    departments: tuple[Department, ...]
    teams: tuple[TeamSpec, ...]
    jobs: tuple[Job, ...] = field(repr=False)

    @property
    def gpus(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    def gpus_of(self, model: str) -> int:
        return sum(1 for n in self.nodes for g in n.gpus if g.model == model)


# Shapes: (gpu_request, gpu_count, weight).
SHAPES = ((0.25, 1, 0.2), (0.5, 1, 0.25), (1.0, 1, 0.3), (1.0, 2, 0.12), (1.0, 4, 0.09), (1.0, 8, 0.04))
# Interactive maximum durations (hours) and how often each is asked for.
MAX_HOURS = ((1.0, 0.3), (2.0, 0.3), (4.0, 0.25), (8.0, 0.15))
PRIORITIES = ((1, 0.6), (2, 0.3), (5, 0.1))


def make_fleet(pools: Sequence[Pool], scale: int = 1) -> tuple[Node, ...]:
    nodes = []
    for pool in pools:
        for k in range(pool.nodes * scale):
            name = f"{pool.model.lower()}-{k:03d}"
            gpus = tuple(Gpu(f"{name}/gpu{j}", j, pool.model, pool.memory_mib,
                             nvlink_peers=frozenset(range(pool.gpus_per_node)) - {j})
                         for j in range(pool.gpus_per_node))
            nodes.append(Node(name, gpus, cpu_milli_free=pool.cpu_milli_per_gpu * pool.gpus_per_node,
                              memory_mib_free=pool.memory_mib_per_gpu * pool.gpus_per_node))
    return tuple(nodes)


def _pick(rng: np.random.Generator, table: Sequence[tuple]) -> tuple:
    weights = np.array([row[-1] for row in table], dtype=float)
    return table[int(rng.choice(len(table), p=weights / weights.sum()))]


def _draw_job(rng: np.random.Generator, cfg: TenantConfig, team: TeamSpec, pools: dict[str, Pool]) -> dict:
    """One job's shape, model, priority and durations (not its id, team or arrival)."""
    request, count, _ = _pick(rng, SHAPES)
    u = rng.random()
    model: str | None = team.model
    if u < cfg.any_model:
        model = None
    elif u < cfg.any_model + cfg.other_model:
        model = str(rng.choice(sorted(pools)))
    fitting = [p for p in pools.values() if p.gpus_per_node >= count and (model is None or p.model == model)]
    if not fitting:  # more GPUs than one node of that model holds: the team's model at its node size
        count = pools[model].gpus_per_node if model is not None else max(p.gpus_per_node for p in pools.values())
        fitting = [p for p in pools.values() if p.gpus_per_node >= count and (model is None or p.model == model)]
    smallest = min(p.memory_mib for p in fitting)
    memory = int(request * smallest * 0.9) if request < 1.0 else 0
    priority = 0 if rng.random() < cfg.opportunistic else int(_pick(rng, PRIORITIES)[0])
    if rng.random() < cfg.interactive:
        max_duration = float(_pick(rng, MAX_HOURS)[0]) * HOUR
        # Many run until their reservation expires; the others stop earlier.
        duration = max_duration * min(1.0, float(rng.lognormal(math.log(cfg.early_median), cfg.early_sigma)))
    else:
        max_duration = None
        duration = min(cfg.batch_max_h * HOUR,
                       float(rng.lognormal(math.log(cfg.batch_median_h * HOUR), cfg.batch_sigma)))
    duration = max(60.0, round(duration))
    return {
        "gpu_request": float(request), "gpu_count": int(count), "gpu_model": model, "gpu_memory_mib": memory,
        "priority": priority, "duration": duration, "max_duration": max_duration,
        "cpu_milli": 2000 * count, "memory_mib": 8192 * count,
    }


def _gpu_s(job: dict) -> float:
    return job["gpu_request"] * job["gpu_count"] * job["duration"]


def _teams(cfg: TenantConfig, rng: np.random.Generator, gpus: int) -> tuple[list[Department], list[TeamSpec]]:
    departments = [Department(DEPARTMENT_NAMES[d]) for d in range(cfg.departments)]
    zipf = np.array([1.0 / (k + 1) ** cfg.skew for k in range(cfg.teams)])
    demand = rng.permutation(zipf / zipf.sum())
    # Teams take models so that each pool's share of the demand is near its share of the GPUs:
    # the largest team first, to the pool furthest below its share.
    gpus_per_pool = {p.model: p.nodes * p.gpus_per_node for p in cfg.pools}
    total = sum(gpus_per_pool.values())
    taken = dict.fromkeys(gpus_per_pool, 0.0)
    model_of: dict[int, str] = {}
    for k in sorted(range(cfg.teams), key=lambda k: -demand[k]):
        model = max(gpus_per_pool, key=lambda m: (gpus_per_pool[m] / total - taken[m], m))
        model_of[k] = model
        taken[model] += float(demand[k])
    teams = []
    for k in range(cfg.teams):
        dept = departments[k % cfg.departments].name
        teams.append(TeamSpec(
            name=f"{dept}-t{k // cfg.departments}", department=dept, demand=float(demand[k]), model=model_of[k],
            quota_gpus=gpus / cfg.teams, phase_h=float(rng.uniform(0, 24)),
        ))
    return departments, teams


def generate(cfg: TenantConfig | None = None) -> TenantTrace:
    """The trace for `cfg` (the same one for the same config)."""
    cfg = cfg or TenantConfig()
    nodes = make_fleet(cfg.pools, cfg.scale)
    gpus = sum(len(n.gpus) for n in nodes)
    rng = np.random.default_rng(cfg.seed)
    departments, teams = _teams(cfg, rng, gpus)
    pools = {p.model: p for p in cfg.pools}
    # The mean GPU-seconds of a job, from a pilot sample on a stream of its own; arrivals come a
    # little faster than that asks, then seeded random jobs are dropped down to the load.
    pilot = np.random.default_rng([cfg.seed, 1])
    mean_gpu_s = float(np.mean([_gpu_s(_draw_job(pilot, cfg, teams[k % len(teams)], pools)) for k in range(2000)]))
    rate = 1.6 * cfg.load * gpus / mean_gpu_s  # jobs per second, all teams
    jobs: list[Job] = []
    for team in teams:
        team_rng = np.random.default_rng([cfg.seed, 2, teams.index(team)])
        peak = rate * team.demand * (1 + cfg.day_swing)
        t = 0.0
        while True:
            t += float(team_rng.exponential(1.0 / peak))
            if t >= cfg.horizon_s:
                break
            # Thinning: the day cycle, peaking at the team's phase.
            level = 1 + cfg.day_swing * math.cos(2 * math.pi * (t / HOUR - team.phase_h) / 24)
            if team_rng.random() * (1 + cfg.day_swing) > level:
                continue
            jobs.append(Job(id="", team=team.name, arrival=round(t, 3), **_draw_job(team_rng, cfg, team, pools)))
    jobs.sort(key=lambda j: (j.arrival, j.team))
    target = cfg.load * gpus * cfg.horizon_s
    asked = sum(j.gpu_seconds for j in jobs)
    drop_rng = np.random.default_rng([cfg.seed, 3])
    keep = np.ones(len(jobs), dtype=bool)
    for k in drop_rng.permutation(len(jobs)).tolist():
        if asked <= target:
            break
        keep[k] = False
        asked -= jobs[k].gpu_seconds
    jobs = [Job(**{**j.__dict__, "id": f"j{n:06d}"}) for n, j in enumerate(j for j, kept in zip(jobs, keep, strict=True)
                                                                           if kept)]
    return TenantTrace(cfg, nodes, tuple(departments), tuple(teams), tuple(jobs))
