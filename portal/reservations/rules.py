"""Rules a reservation request must satisfy, checked before anything is written.

Each problem is reported against the field it concerns, with the rule it breaks, so the API,
the form and the kubectl-label path all refuse bad input the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from django.db.models import Count, Max

from portal.connect.kinds import app_port_of, app_problems
from portal.errors import RuleViolation
from portal.fleet.model_names import fleet_models
from portal.fleet.models import Gpu
from portal.tenancy.models import LABEL_RE, ExclusionGroup, Team

from .models import Kind

ONE = Decimal("1")
MAX_COMMAND_ARGS = 256
MAX_ARG_LEN = 4096
# OCI reference: [registry[:port]/]path[:tag][@digest]; conservative, lowercase path components.
IMAGE_RE = re.compile(
    r"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)
LABEL = re.compile(LABEL_RE)


@dataclass
class ReservationSpec:
    team: Team
    image: str
    gpu_request: Decimal
    gpu_memory_mib: int
    gpu_limit: Decimal | None = None
    gpu_count: int = 1
    gpu_model: str = ""
    priority: int = 50
    kind: str = Kind.BATCH
    name: str = ""
    command: list[str] = field(default_factory=list)
    affinity: str = ""
    anti_affinity: str = ""
    exclusion: str = ""
    group_name: str = ""
    group_headcount: int | None = None
    group_threshold: Decimal | None = None
    max_duration_s: int | None = None
    requeue_on_preempt: bool = False
    remote_allowed: bool = False
    app: str = ""  # portal.connect.kinds.AppKind: what the reservation page's Open button opens
    app_port: int | None = None  # where it listens; None: the app's default port

    def models(self) -> list[str]:
        return [m for m in self.gpu_model.split("|") if m] if self.gpu_model else []


def fleet_holds(models: list[str], memory_mib: int) -> bool:
    """Exactly whether `check` finds nothing wrong with `models` and `memory_mib` against the fleet:
    every model named exists and one of their cards (any card when none is named) holds
    `memory_mib`. One indexed EXISTS, where fleet_models reads and groups every GPU (4,000 rows,
    ~3 ms of the database's CPU per submit); that is left for the message when the answer is no."""
    cards = Gpu.objects.filter(memory_mib__gte=memory_mib)
    if not models:
        return cards.exists()
    if not cards.filter(model__in=models).exists():
        return False
    named = set(models)
    if len(named) == 1:
        return True
    # order_by(): Gpu's default ordering (node name, index) would join the nodes and make every
    # card its own DISTINCT row.
    return Gpu.objects.filter(model__in=named).order_by().values("model").distinct().count() == len(named)


def largest_node_gpu_count() -> int:
    counts = Gpu.objects.values("node").annotate(n=Count("id")).aggregate(m=Max("n"))["m"]
    return counts or 0


def _decimal(value) -> Decimal:
    number = value if isinstance(value, Decimal) else Decimal(str(value))
    if not number.is_finite():  # NaN would pass quantize and then fail every comparison
        raise InvalidOperation(f"not a finite number: {value!r}")
    return number


def normalize(spec: ReservationSpec) -> None:
    """Coerce numbers (labels and forms give strings, callers floats) and fill derived values:
    the limit defaults to the request; whole GPUs take the whole card."""
    errors = {}
    for name in ("gpu_request", "gpu_limit", "group_threshold"):
        value = getattr(spec, name)
        if value is None:
            continue
        try:
            setattr(spec, name, _decimal(value).quantize(Decimal("0.001")))
        except (InvalidOperation, ValueError):
            errors[name] = [f"must be a decimal number, got {value!r}"]
    for name in ("gpu_memory_mib", "gpu_count", "priority", "group_headcount", "max_duration_s", "app_port"):
        value = getattr(spec, name)
        if value is None or isinstance(value, int):
            continue
        try:
            setattr(spec, name, int(str(value)))
        except ValueError:
            errors[name] = [f"must be a whole number, got {value!r}"]
    if errors:
        raise RuleViolation(errors)
    if spec.gpu_count >= 2 and spec.gpu_limit is None and spec.gpu_request == ONE:
        spec.gpu_limit = ONE
    if spec.gpu_limit is None:
        spec.gpu_limit = spec.gpu_request
    spec.app = spec.app or ""


def check(spec: ReservationSpec) -> None:
    """Raise RuleViolation naming every field that breaks a rule."""
    normalize(spec)
    errors: dict[str, list[str]] = {}

    def bad(name: str, message: str) -> None:
        errors.setdefault(name, []).append(message)

    if not IMAGE_RE.match(spec.image or ""):
        bad("image", "must be a container image reference such as 'registry.example.com/team/app:1.2'")
    if len(spec.command) > MAX_COMMAND_ARGS or any(len(a) > MAX_ARG_LEN for a in spec.command):
        bad("command", f"at most {MAX_COMMAND_ARGS} arguments of at most {MAX_ARG_LEN} characters")
    if spec.name and not LABEL.match(spec.name):
        bad("name", "must be 1-63 letters, digits, '-', '_' or '.', starting and ending alphanumeric")

    if spec.gpu_count < 1:
        bad("gpu_count", "must be at least 1")
    if not (Decimal(0) < spec.gpu_request <= ONE):
        bad("gpu_request", "must be greater than 0 and at most 1.0 (a fraction of one GPU)")
    elif not (spec.gpu_request <= spec.gpu_limit <= ONE):
        bad("gpu_limit", f"must be between gpu_request ({spec.gpu_request}) and 1.0")
    if spec.gpu_count >= 2 and (spec.gpu_request != ONE or spec.gpu_limit != ONE):
        bad("gpu_request", "multi-GPU reservations take whole cards: gpu_request and gpu_limit must be 1.0")
    if spec.gpu_count >= 2:
        most = largest_node_gpu_count()
        if spec.gpu_count > most:
            bad("gpu_count", f"no node has {spec.gpu_count} GPUs (the largest has {most})")

    if spec.remote_allowed and (spec.gpu_count != 1 or spec.gpu_request >= ONE):
        # scheduler.core.remote: an exclusive GPU always runs where its pod runs
        bad("remote_allowed", "only a share of one GPU (below 1) can be remote; whole GPUs run where the pod runs")

    if not (0 <= spec.priority <= 100):
        bad("priority", "must be between 0 (opportunistic) and 100")

    wanted = spec.models()
    if spec.gpu_memory_mib <= 0 or not fleet_holds(wanted, spec.gpu_memory_mib):  # else no error below
        known = fleet_models()
        unknown = [m for m in wanted if m not in known]
        if unknown:
            bad("gpu_model", f"unknown GPU model {', '.join(unknown)}; known: {', '.join(sorted(known)) or 'none'}")
        largest = max((known[m] for m in wanted if m in known), default=max(known.values(), default=0))
        if spec.gpu_memory_mib <= 0:
            bad("gpu_memory_mib", "must be greater than 0")
        elif spec.gpu_memory_mib > largest:
            what = f"a {'|'.join(wanted)}" if wanted else "any"
            bad("gpu_memory_mib", f"{spec.gpu_memory_mib} MiB is more than {what} card holds ({largest} MiB)")

    for name in ("affinity", "anti_affinity", "exclusion", "group_name"):
        value = getattr(spec, name)
        if value and not LABEL.match(value):
            bad(name, "must be 1-63 letters, digits, '-', '_' or '.', starting and ending alphanumeric")
    if (spec.exclusion and LABEL.match(spec.exclusion)
            and not ExclusionGroup.objects.filter(team=spec.team, label=spec.exclusion).exists()):
        bad("exclusion", f"team {spec.team.slug} has no exclusion group '{spec.exclusion}'")

    for name, messages in app_problems(spec.app, spec.app_port).items():
        for message in messages:
            bad(name, message)
    if not errors.get("app") and not errors.get("app_port"):
        spec.app_port = app_port_of(spec.app, spec.app_port)

    if spec.group_name:
        if spec.group_headcount is None or spec.group_headcount < 1:
            bad("group_headcount", "a pod group needs a headcount of at least 1")
        if spec.group_threshold is None:
            spec.group_threshold = ONE
        if not (Decimal(0) < spec.group_threshold <= ONE):
            bad("group_threshold", "must be greater than 0 and at most 1")
    elif spec.group_headcount is not None or spec.group_threshold is not None:
        bad("group_name", "required when group_headcount or group_threshold is given")

    if spec.max_duration_s is not None and not (60 <= spec.max_duration_s <= 30 * 86400):
        bad("max_duration_s", "must be between 60 seconds and 30 days")
    if spec.kind not in Kind.values:
        bad("kind", f"must be one of {', '.join(Kind.values)}")

    if errors:
        raise RuleViolation(errors)
