"""A team's policy: what its admins chose (durations, idle handling, priority ceilings per role,
opportunistic use) within the limits the site admins set for it.

One reader for everyone: `policy_of(team)` (request page, submit checks, idle reclaim, the grace
before a borrowed reservation is reclaimed, reports).
One writer per side: `set_policy` (team admins and staff) and `set_limits` (staff only). Both
refuse, naming the field and the limit, anything outside the limits, and write nothing then.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from decimal import Decimal, InvalidOperation

from django.db import transaction

from portal.audit import services as audit
from portal.cycle_requests import request_cycle
from portal.errors import RuleViolation

from .models import LONGEST_DURATION_S, Role, Team, TeamPolicy


@dataclass(frozen=True)
class Limits:
    """Set by site admins."""

    duration_s: int
    priority: int
    idle_after_s: int | None
    idle_threshold: Decimal
    require_reclaim: bool
    idle_warning_s: int | None  # the longest warning before a reclaim the team may give (None: any)
    allow_over_quota: bool


@dataclass(frozen=True)
class Policy:
    """Set by the team's admins (within `limits`)."""

    max_duration_s: int  # the longest a member may ask for (the site limit when the team set none)
    interactive_max_s: int  # the default duration of interactive reservations submitted without one
    idle_threshold: Decimal  # using less than this fraction of a GPU counts as idle
    idle_after_s: int  # idle this long: warned, then reclaimed when idle_reclaim
    idle_reclaim: bool  # False: warn only
    idle_warning_s: int  # warned (flagged idle) this long before the reclaim, if still idle
    max_priority_member: int
    max_priority_admin: int
    allow_over_quota: bool  # priority-0 requests beyond the quota run opportunistically
    limits: Limits
    allow_remote: bool = False  # requests may ask for a share of a GPU on another node
    reclaim_grace_s: int = 300  # a borrowed reservation being reclaimed runs this long after its warning
    booking_no_show_min: int = 20  # a started booking with no process on its GPU this long is released
    connect_admins: bool = False  # team admins may open the apps of members' reservations (portal.connect)

    def max_priority(self, role: str | None) -> int:
        """The highest priority someone with `role` may give a request (managers submit nothing)."""
        if role == Role.ADMIN:
            return self.max_priority_admin
        if role == Role.MEMBER:
            return self.max_priority_member
        return 0

    def as_dict(self) -> dict:
        data = asdict(self)
        data["idle_threshold"] = str(self.idle_threshold)
        data["limits"]["idle_threshold"] = str(self.limits.idle_threshold)
        return data


def _row(team: Team) -> TeamPolicy:
    if Team.policy.is_cached(team):  # read with the team (select_related("policy")): no query
        try:
            return team.policy
        except TeamPolicy.DoesNotExist:
            return TeamPolicy(team_id=team.pk)
    # team_id, not team: the default row must not be cached on `team` as if it had been read.
    return TeamPolicy.objects.filter(team=team).first() or TeamPolicy(team_id=team.pk)


def policy_of(team: Team) -> Policy:
    row = _row(team)
    limits = Limits(duration_s=row.limit_duration_s, priority=row.limit_priority,
                    idle_after_s=row.limit_idle_after_s, idle_threshold=row.limit_idle_threshold,
                    require_reclaim=row.limit_require_reclaim, allow_over_quota=row.limit_allow_over_quota,
                    idle_warning_s=row.limit_idle_warning_s)
    return Policy(
        max_duration_s=min(row.max_duration_s or limits.duration_s, limits.duration_s),
        interactive_max_s=team.interactive_max_s,
        idle_threshold=team.idle_threshold,
        idle_after_s=team.idle_after_s,
        idle_reclaim=team.idle_reclaim,
        idle_warning_s=team.idle_warning_s,
        max_priority_member=min(row.max_priority_member, limits.priority),
        max_priority_admin=min(row.max_priority_admin, limits.priority),
        allow_over_quota=team.allow_over_quota and limits.allow_over_quota,
        limits=limits,
        allow_remote=row.allow_remote,
        reclaim_grace_s=row.reclaim_grace_s,
        booking_no_show_min=row.booking_no_show_min,
        connect_admins=row.connect_admins,
    )


def max_priority_for(user, team: Team, policy: Policy | None = None) -> int:
    """The highest priority `user` may give a request of `team` (site admins: any); `policy`:
    the team's, when the caller has read it already."""
    from . import roles

    if user.is_staff:
        return 100
    return (policy or policy_of(team)).max_priority(roles.role_in(user, team))


def request_problems(user, team: Team, *, priority: int | None, max_duration_s: int | None,
                     remote_allowed: bool = False) -> dict[str, list[str]]:
    """What in a request breaks the team's policy, per field (empty: nothing)."""
    policy = policy_of(team)
    errors: dict[str, list[str]] = {}
    if remote_allowed and not policy.allow_remote:
        errors["remote_allowed"] = [f"team {team.slug} does not allow remote GPU shares; "
                                    "ask a team admin to allow them, or leave this off"]
    ceiling = max_priority_for(user, team, policy)
    if priority is not None and priority > ceiling:
        errors["priority"] = [f"team {team.slug} lets you use priority up to {ceiling}; ask a team admin for more"]
    if max_duration_s is not None and max_duration_s > policy.max_duration_s and not user.is_staff:
        errors["max_duration_s"] = [f"team {team.slug} allows at most {policy.max_duration_s} s "
                                    f"({policy.max_duration_s / 3600:g} h); ask for less"]
    return errors


# Team-admin fields: (name, where it is stored).
TEAM_FIELDS = ("interactive_max_s", "idle_threshold", "idle_after_s", "idle_reclaim", "idle_warning_s",
               "allow_over_quota")
POLICY_FIELDS = ("max_duration_s", "max_priority_member", "max_priority_admin", "allow_remote", "reclaim_grace_s",
                 "booking_no_show_min", "connect_admins")
LIMIT_FIELDS = ("limit_duration_s", "limit_priority", "limit_idle_after_s", "limit_idle_threshold",
                "limit_require_reclaim", "limit_allow_over_quota", "limit_idle_warning_s")
# A warning must leave the owner time to act, and a reclaim must come within a day of it.
IDLE_WARNING_MIN_S, IDLE_WARNING_MAX_S = 60, 86400
# A borrowed reservation may be reclaimed at once (0), or at the latest a day after its warning.
RECLAIM_GRACE_MAX_S = 86400
# The range of each whole-number setting (seconds, or priorities); the API's schema states the same.
WHOLE_NUMBERS = {
    "max_duration_s": (60, LONGEST_DURATION_S), "interactive_max_s": (60, LONGEST_DURATION_S),
    "idle_after_s": (60, LONGEST_DURATION_S), "limit_duration_s": (60, LONGEST_DURATION_S),
    "limit_idle_after_s": (60, LONGEST_DURATION_S),
    "idle_warning_s": (IDLE_WARNING_MIN_S, IDLE_WARNING_MAX_S), "limit_idle_warning_s": (IDLE_WARNING_MIN_S,
                                                                                         IDLE_WARNING_MAX_S),
    "reclaim_grace_s": (0, RECLAIM_GRACE_MAX_S), "booking_no_show_min": (1, 1440),
    "max_priority_member": (0, 100), "max_priority_admin": (0, 100), "limit_priority": (0, 100),
}
NO_LIMIT_WHEN_BLANK = {"max_duration_s", "limit_idle_after_s", "limit_idle_warning_s"}  # blank: none of its own
FRACTIONS = {"idle_threshold", "limit_idle_threshold"}  # of one GPU, 0 to 1


def _int(value, name: str, errors: dict, *, low: int, high: int, blank_ok: bool = False) -> int | None:
    if value in (None, "") and blank_ok:
        return None
    try:
        number = int(str(value))
    except (TypeError, ValueError):
        errors.setdefault(name, []).append(f"must be a whole number, got {value!r}")
        return None
    if not low <= number <= high:
        errors.setdefault(name, []).append(out_of_range(low, high))
        return None
    return number


def out_of_range(low, high) -> str:
    return f"must be between {low} and {high}"


def _bool(value, name: str, errors: dict) -> bool | None:
    if isinstance(value, bool):
        return value
    if value in ("true", "on", "1", 1):
        return True
    if value in ("false", "off", "0", 0, "", None):
        return False
    errors.setdefault(name, []).append("must be true or false")
    return None


def _fraction(value, name: str, errors: dict) -> Decimal | None:
    try:
        number = Decimal(str(value)).quantize(Decimal("0.001"))
    except (InvalidOperation, ValueError):
        number = None
    if number is None or not number.is_finite():  # NaN quantizes to NaN, and compares to nothing
        errors.setdefault(name, []).append(f"must be a decimal number between 0 and 1, got {value!r}")
        return None
    if not Decimal(0) <= number <= 1:
        errors.setdefault(name, []).append(f"{out_of_range(0, 1)} (a fraction of one GPU)")
        return None
    return number


def _snapshot(team: Team, row: TeamPolicy) -> dict:
    data = {f: getattr(team, f) for f in TEAM_FIELDS} | {f: getattr(row, f) for f in POLICY_FIELDS + LIMIT_FIELDS}
    return {k: str(v) if isinstance(v, Decimal) else v for k, v in data.items()}


def set_policy(team: Team, by: audit.Actor, changes: dict) -> Policy:
    """Team admins' part of the policy; fields not in `changes` keep their values."""
    unknown = set(changes) - set(TEAM_FIELDS) - set(POLICY_FIELDS)
    if unknown:
        raise RuleViolation({name: ["not a team policy setting"] for name in sorted(unknown)})
    with transaction.atomic():
        team = Team.objects.select_for_update().get(pk=team.pk)
        row = _row(team)
        before = _snapshot(team, row)
        errors: dict[str, list[str]] = {}
        values = _parse(changes, errors)
        limit_d = row.limit_duration_s
        if "max_duration_s" in values and values["max_duration_s"] is not None and values["max_duration_s"] > limit_d:
            errors.setdefault("max_duration_s", []).append(f"the site admins allow this team at most {limit_d} s")
        if "interactive_max_s" in values and values["interactive_max_s"] > limit_d:
            errors.setdefault("interactive_max_s", []).append(f"the site admins allow this team at most {limit_d} s")
        for name in ("max_priority_member", "max_priority_admin"):
            if name in values and values[name] > row.limit_priority:
                errors.setdefault(name, []).append(
                    f"the site admins allow this team priorities up to {row.limit_priority}")
        if ("idle_after_s" in values and row.limit_idle_after_s is not None
                and values["idle_after_s"] > row.limit_idle_after_s):
            errors.setdefault("idle_after_s", []).append(
                f"the site admins want idle reservations acted on within {row.limit_idle_after_s} s")
        if ("idle_warning_s" in values and row.limit_idle_warning_s is not None
                and values["idle_warning_s"] > row.limit_idle_warning_s):
            errors.setdefault("idle_warning_s", []).append(
                f"the site admins want idle reservations reclaimed within {row.limit_idle_warning_s} s of the "
                "warning")
        if "idle_threshold" in values and values["idle_threshold"] < row.limit_idle_threshold:
            errors.setdefault("idle_threshold", []).append(
                f"the site admins set the lowest idle threshold to {row.limit_idle_threshold}")
        if values.get("idle_reclaim") is False and row.limit_require_reclaim:
            errors.setdefault("idle_reclaim", []).append(
                "the site admins require idle reservations to be reclaimed (warn-only is not allowed)")
        if values.get("allow_over_quota") and not row.limit_allow_over_quota:
            errors.setdefault("allow_over_quota", []).append(
                "the site admins do not allow this team opportunistic use beyond its quota")
        max_d = values.get("max_duration_s", row.max_duration_s)
        default_d = values.get("interactive_max_s", team.interactive_max_s)
        if max_d is not None and default_d > max_d and "interactive_max_s" not in errors:
            errors.setdefault("interactive_max_s", []).append(
                f"the default duration ({default_d} s) must not exceed the maximum duration ({max_d} s)")
        if errors:
            raise RuleViolation(errors)
        _store(team, row, values, by, before, "policy changed")
    return policy_of(team)


def set_limits(team: Team, by: audit.Actor, changes: dict) -> Policy:
    """Site admins' limits. Values the team's admins chose above a new limit are lowered to it
    (stated in the audit entry), so the policy is always within its limits."""
    unknown = set(changes) - set(LIMIT_FIELDS)
    if unknown:
        raise RuleViolation({name: ["not a team limit"] for name in sorted(unknown)})
    with transaction.atomic():
        team = Team.objects.select_for_update().get(pk=team.pk)
        row = _row(team)
        before = _snapshot(team, row)
        errors: dict[str, list[str]] = {}
        values = _parse(changes, errors)
        if errors:
            raise RuleViolation(errors)
        merged = {f: values.get(f, getattr(row, f)) for f in LIMIT_FIELDS}
        follow = {}  # the team's own choices that the new limits push down
        if row.max_duration_s is not None and row.max_duration_s > merged["limit_duration_s"]:
            follow["max_duration_s"] = merged["limit_duration_s"]
        if team.interactive_max_s > merged["limit_duration_s"]:
            follow["interactive_max_s"] = merged["limit_duration_s"]
        for name in ("max_priority_member", "max_priority_admin"):
            if getattr(row, name) > merged["limit_priority"]:
                follow[name] = merged["limit_priority"]
        if merged["limit_idle_after_s"] is not None and team.idle_after_s > merged["limit_idle_after_s"]:
            follow["idle_after_s"] = merged["limit_idle_after_s"]
        if merged["limit_idle_warning_s"] is not None and team.idle_warning_s > merged["limit_idle_warning_s"]:
            follow["idle_warning_s"] = merged["limit_idle_warning_s"]
        if team.idle_threshold < merged["limit_idle_threshold"]:
            follow["idle_threshold"] = merged["limit_idle_threshold"]
        if merged["limit_require_reclaim"] and not team.idle_reclaim:
            follow["idle_reclaim"] = True
        if not merged["limit_allow_over_quota"] and team.allow_over_quota:
            follow["allow_over_quota"] = False
        _store(team, row, values | follow, by, before, "limits changed")
    return policy_of(team)


def _parse(changes: dict, errors: dict) -> dict:
    out: dict = {}
    for name, value in changes.items():
        if name in WHOLE_NUMBERS:
            low, high = WHOLE_NUMBERS[name]
            parsed = _int(value, name, errors, low=low, high=high, blank_ok=name in NO_LIMIT_WHEN_BLANK)
        elif name in FRACTIONS:
            parsed = _fraction(value, name, errors)
        else:
            parsed = _bool(value, name, errors)
        if name not in errors:
            out[name] = parsed
    return out


def _store(team: Team, row: TeamPolicy, values: dict, by: audit.Actor, before: dict, message: str) -> None:
    team_fields = [f for f in TEAM_FIELDS if f in values]
    for f in team_fields:
        setattr(team, f, values[f])
    if team_fields:
        team.save(update_fields=team_fields)
    for f in POLICY_FIELDS + LIMIT_FIELDS:
        if f in values:
            setattr(row, f, values[f])
    row.save()
    # A policy may now let waiting requests in (remote shares, over-quota use): look at all of them.
    request_cycle(f"policy of team {team.slug} changed", freed=True)
    old, new = audit.changed(before, _snapshot(team, row))
    if new:
        audit.record(by, object_type="policy", object_id=team.pk, object_repr=f"policy of {team.slug}", team=team,
                     action="limits" if message.startswith("limits") else "changed", before=old, after=new,
                     message=message)
