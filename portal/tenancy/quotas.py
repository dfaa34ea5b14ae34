"""Quotas per GPU model of teams and departments: the only writer of Quota rows.

A unit (team or department) has at most one row per bucket: a GPU model of the fleet, or `*` for
every model without a row of its own there. `replace_quotas` takes the whole list (PUT semantics)
and refuses, per row and field, what is malformed, and, with the numbers, a change after which
children's quotas would exceed their parent's (portal.tenancy.quota_tree). A quota below what the
unit holds now is allowed: work beyond a quota is borrowed, and reclaimable.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from django.db import transaction

from portal.audit import services as audit
from portal.cycle_requests import request_cycle
from portal.errors import RuleViolation
from portal.fleet.model_names import fleet_models, label_name

from . import quota_tree
from .models import ANY_MODEL, MILLI, Department, Quota, Team

MAX_ROWS = 64
# Resource → (largest value, unit in words). gpu_memory_gib: the column holds less than 10^9.
BOUNDS = {"gpu_share": (Decimal(100000), "GPUs of share"), "gpu_memory_gib": (Decimal("999999999.999"), "GiB"),
          "gpus": (10**6, "GPUs")}
MAX_WEIGHT = Decimal(1000)
ROW_FIELDS = ("gpu_model", *quota_tree.RESOURCES, "borrowing_limit", "lending_limit", "weight")
LIMIT_PREFIX = {"borrowing_limit": "borrow_", "lending_limit": "lend_"}

Unit = Team | Department
Limit = dict[str, Decimal | int | None]  # resource → value; None: unlimited


@dataclass(frozen=True)
class Row:
    gpu_model: str
    gpu_share: Decimal
    gpu_memory_gib: Decimal
    gpus: int
    borrowing_limit: tuple  # (gpu_share, gpu_memory_gib, gpus), each None for unlimited
    lending_limit: tuple
    weight: Decimal

    @property
    def amount(self) -> quota_tree.Amount:
        return quota_tree.Amount(self.gpu_share, self.gpu_memory_gib, self.gpus)

    def as_dict(self) -> dict:
        def limit(values: tuple) -> Limit | None:
            return None if all(v is None for v in values) else dict(zip(quota_tree.RESOURCES, values, strict=True))

        return {"gpu_model": self.gpu_model, "gpu_share": self.gpu_share, "gpu_memory_gib": self.gpu_memory_gib,
                "gpus": self.gpus, "borrowing_limit": limit(self.borrowing_limit),
                "lending_limit": limit(self.lending_limit), "weight": self.weight}

    def columns(self) -> dict:
        out = {"gpu_model": self.gpu_model, "gpu_share": self.gpu_share, "gpu_memory_gib": self.gpu_memory_gib,
               "gpus": self.gpus, "weight": self.weight}
        for name, values in (("borrowing_limit", self.borrowing_limit), ("lending_limit", self.lending_limit)):
            out |= {LIMIT_PREFIX[name] + r: v for r, v in zip(quota_tree.RESOURCES, values, strict=True)}
        return out

    @classmethod
    def of(cls, q: Quota) -> Row:
        return cls(q.gpu_model, q.gpu_share, q.gpu_memory_gib, q.gpus,
                   tuple(getattr(q, "borrow_" + r) for r in quota_tree.RESOURCES),
                   tuple(getattr(q, "lend_" + r) for r in quota_tree.RESOURCES), q.weight)


def _order(rows: list[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: (r.gpu_model != ANY_MODEL, r.gpu_model))


def _rows(unit: Unit) -> list[Row]:
    return _order([Row.of(q) for q in _owned(unit)])


def _owned(unit: Unit):
    return Quota.objects.filter(team=unit) if isinstance(unit, Team) else Quota.objects.filter(department=unit)


def quotas_of(unit: Unit) -> list[dict]:
    """The unit's rows, `*` first then by model: {"gpu_model", "gpu_share" (Decimal), "gpu_memory_gib"
    (Decimal), "gpus" (int), "borrowing_limit" / "lending_limit" (None: unlimited, or {"gpu_share",
    "gpu_memory_gib", "gpus"} each None for unlimited), "weight" (Decimal)}."""
    return [r.as_dict() for r in _rows(unit)]


# Parsing: every refusal names the row and field (`quotas[2].gpu_share`) and says what to give.
def _number(value, resource: str) -> Decimal | int | str:
    """The value, or the words saying why it is not one."""
    high, unit = BOUNDS[resource]
    if resource == "gpus":
        if isinstance(value, bool) or not isinstance(value, int | str | Decimal) or not str(value).strip().isdigit():
            return f"must be a whole number of GPUs (0 to {high}), got {value!r}"
        number = int(str(value).strip())
    else:
        number = _decimal(value)
        if number is None:
            return f"must be a decimal number of {unit}, got {value!r}"
    if number < 0:
        return f"must not be negative (0 to {high} {unit})"
    if number > high:
        return f"must be at most {high} {unit}"
    return number if resource == "gpus" else number.quantize(MILLI)


def _decimal(value) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        return None
    try:
        number = Decimal(str(value).strip())
    except (InvalidOperation, ValueError):
        return None
    return number if number.is_finite() else None


def _limit(value, name: str, errors: dict) -> tuple:
    if value is None:
        return (None, None, None)
    if not isinstance(value, dict):
        errors[name] = [f"must be null (unlimited) or an object with {', '.join(quota_tree.RESOURCES)}"]
        return (None, None, None)
    unknown = sorted(set(value) - set(quota_tree.RESOURCES))
    if unknown:
        errors[name] = [f"has no {', '.join(map(str, unknown))}; give {', '.join(quota_tree.RESOURCES)}"]
    out = []
    for resource in quota_tree.RESOURCES:
        raw = value.get(resource)
        number = None if raw is None else _number(raw, resource)
        if isinstance(number, str):
            errors.setdefault(name, []).append(f"{resource} {number}")
            number = None
        out.append(number)
    return tuple(out)


def _model_names(unit: Unit) -> tuple[dict[str, str], list[str]]:
    """Every name a model may be given by → the name rows store (the display name, as Gpu.model
    and the engine have it), and the display names for messages. A model the unit already has a
    row for stays allowed, so that its other rows can be edited after the model left the fleet."""
    known = sorted(fleet_models())
    names = {ANY_MODEL: ANY_MODEL}
    for model in [*known, *_owned(unit).values_list("gpu_model", flat=True)]:
        names[model] = model
        names.setdefault(label_name(model), model)
    return names, known


def parse(unit: Unit, rows) -> list[Row]:
    """The rows as given (dicts of ROW_FIELDS), checked one by one; RuleViolation with every problem."""
    if not isinstance(rows, list | tuple):
        raise RuleViolation({"quotas": ["give a list of quota rows (each with gpu_model, gpu_share, gpu_memory_gib "
                                        "and gpus)"]})
    if len(rows) > MAX_ROWS:
        raise RuleViolation({"quotas": [f"at most {MAX_ROWS} rows (one per GPU model and one for *); got {len(rows)}"]})
    names, known = _model_names(unit)
    errors: dict[str, list[str]] = {}
    out: list[Row] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(rows):
        at = f"quotas[{i}]"
        if not isinstance(raw, dict):
            errors[at] = ["must be an object with gpu_model, gpu_share, gpu_memory_gib and gpus"]
            continue
        mine: dict[str, list[str]] = {}
        for name in sorted(set(raw) - set(ROW_FIELDS), key=str):
            mine[str(name)] = [f"not a quota field; the fields are {', '.join(ROW_FIELDS)}"]
        model = raw.get("gpu_model")
        if not isinstance(model, str) or not model.strip():
            mine["gpu_model"] = ["give a GPU model name, or * for any model without a row of its own"]
        elif model.strip() not in names:
            mine["gpu_model"] = [f"no GPU model {model.strip()!r} in the fleet; known models: "
                                 f"{', '.join(known) or 'none yet'} (or * for any model)"]
        else:
            model = names[model.strip()]
            if model in seen:
                mine["gpu_model"] = [f"{model} is named twice (rows {seen[model]} and {i}); give one row per model"]
            seen.setdefault(model, i)
        amounts = {}
        for resource in quota_tree.RESOURCES:
            if raw.get(resource) is None:
                mine[resource] = ["required: a number (0 for none)"]
                continue
            number = _number(raw[resource], resource)
            if isinstance(number, str):
                mine[resource] = [number]
            else:
                amounts[resource] = number
        limits = {name: _limit(raw.get(name), name, mine) for name in LIMIT_PREFIX}
        weight = Decimal("1.000")
        if raw.get("weight") is not None:
            weight = _decimal(raw["weight"])
            weight = weight.quantize(MILLI) if weight is not None and 0 < weight <= MAX_WEIGHT else None
            if not weight:  # None, or a positive weight below 0.0005 that rounds to 0
                mine["weight"] = [f"must be a number above 0 and at most {MAX_WEIGHT} (1: an equal share), "
                                  f"got {raw['weight']!r}"]
        for resource, lend in zip(quota_tree.RESOURCES, limits["lending_limit"], strict=True):
            if lend is not None and resource in amounts and lend > amounts[resource]:
                mine.setdefault("lending_limit", []).append(
                    f"{resource} {quota_tree.show(resource, lend)} is above the quota "
                    f"{quota_tree.show(resource, amounts[resource])}; a unit lends at most its own quota")
        if mine:
            errors |= {f"{at}.{name}": messages for name, messages in mine.items()}
            continue
        out.append(Row(model, amounts["gpu_share"], amounts["gpu_memory_gib"], amounts["gpus"],
                       limits["borrowing_limit"], limits["lending_limit"], weight))
    if errors:
        raise RuleViolation(errors)
    return _order(out)


def replace_quotas(unit: Unit, by: audit.Actor, rows) -> list[dict]:
    """The unit's rows become `rows` (dicts of ROW_FIELDS: gpu_model, gpu_share, gpu_memory_gib, gpus,
    and optionally borrowing_limit, lending_limit, weight): those not listed are deleted. RuleViolation
    (and nothing written) if a row is malformed or children's quotas would not fit their parent's,
    here or above. Answers quotas_of(unit)."""
    parsed = parse(unit, rows)
    with transaction.atomic():
        _store(unit, by, parsed, lambda problem: "quotas")
    return quotas_of(unit)


def set_any_model_quota(team: Team, by: audit.Actor, amounts: dict, field_names: dict[str, str]) -> None:
    """Only the team's `*` row's amounts (`amounts`: resource → checked value), as the deprecated team
    fields write it; a team without a `*` row gets one (0 for what is not given, no limits,
    weight 1). Fit problems are reported on `field_names[resource]`."""
    with transaction.atomic():
        quota_tree.lock()
        rows = {r.gpu_model: r for r in _rows(team)}
        old = rows.get(ANY_MODEL) or Row(ANY_MODEL, Decimal("0.000"), Decimal("0.000"), 0, (None,) * 3, (None,) * 3,
                                         Decimal(1))
        values = {r: amounts.get(r, getattr(old, r)) for r in quota_tree.RESOURCES}
        # A lending limit never stays above a lowered quota: it is lowered with it.
        lend = tuple(None if v is None else min(v, values[r])
                     for r, v in zip(quota_tree.RESOURCES, old.lending_limit, strict=True))
        rows[ANY_MODEL] = Row(ANY_MODEL, values["gpu_share"], values["gpu_memory_gib"], values["gpus"],
                              old.borrowing_limit, lend, old.weight)
        _store(team, by, _order(list(rows.values())), lambda problem: field_names[problem.resource], locked=True)


def _store(unit: Unit, by: audit.Actor, rows: list[Row], key_of, locked: bool = False) -> None:
    """Inside a transaction: lock, check the tree with the new rows, write, audit, ask for a cycle."""
    if not locked:
        quota_tree.lock()
    is_team = isinstance(unit, Team)
    if is_team:
        list(Team.objects.select_for_update().filter(pk=unit.pk).values_list("pk", flat=True))
    before = _rows(unit)
    if before == rows:
        return
    tree = quota_tree.QuotaTree.load()
    key = ("team" if is_team else "department", unit.pk)
    tree.set_rows(key, {r.gpu_model: r.amount for r in rows})
    errors: dict[str, list[str]] = {}
    for problem in tree.problems_up(key):
        errors.setdefault(key_of(problem), []).append(problem.message)
    if errors:
        raise RuleViolation(errors)
    _owned(unit).delete()
    owner = {"team": unit} if is_team else {"department": unit}
    Quota.objects.bulk_create([Quota(**owner, **r.columns()) for r in rows])
    old, new = _jsonable(before), _jsonable(rows)
    buckets = [b for b in {**old, **new} if old.get(b) != new.get(b)]  # a bucket gone is None after
    audit.record(by, object_type="quota", object_id=unit.pk, team=unit if is_team else None,
                 object_repr=f"quotas of {unit.slug}" if is_team else f"quotas of department {unit.slug}",
                 action="changed", before={b: old.get(b) for b in buckets}, after={b: new.get(b) for b in buckets})
    request_cycle(f"quotas of {'team' if is_team else 'department'} {unit.slug} changed", freed=True)


def _jsonable(rows: list[Row]) -> dict:
    def text(v):
        if isinstance(v, Decimal):
            return str(v)
        if isinstance(v, dict):
            return {k: text(x) for k, x in v.items()}
        return v

    return {r.gpu_model: {k: text(v) for k, v in r.as_dict().items() if k != "gpu_model"} for r in rows}
