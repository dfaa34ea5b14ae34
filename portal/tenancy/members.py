"""Who is in a team with which role: team admins (and site admins) add, change and remove
members. Each operation is audited and states its effect in the words the admin sees."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from portal.audit import services as audit
from portal.errors import RuleViolation

from .models import AffinityLabel, ExclusionGroup, Membership, Role, Team

EFFECT = {
    Role.MEMBER: "{user} will see {team}'s reservations and may request GPU shares for it",
    Role.ADMIN: "{user} will run team {team}: members, groups, presets, policy, and any of its reservations",
    Role.MANAGER: "{user} will see {team}'s reservations and reports, read-only (no requests)",
}


def effect_of(role: str, username: str, team: Team) -> str:
    return EFFECT[Role(role)].format(user=username, team=team.slug)


def find_user(who: str):
    """A user by username or, failing that, by e-mail (case-insensitive, only if one has it)."""
    who = (who or "").strip()
    if not who or len(who) > 254 or "\x00" in who:
        raise RuleViolation({"user": ["give a username or an e-mail address"]})
    User = get_user_model()
    user = User.objects.filter(username=who, is_active=True).first()
    if user is None and "@" in who:
        matches = list(User.objects.filter(email__iexact=who, is_active=True)[:2])
        if len(matches) > 1:
            raise RuleViolation({"user": [f"several accounts use {who}; give the username instead"]})
        user = matches[0] if matches else None
    if user is None:
        raise RuleViolation({"user": [f"no user '{who}'; check the spelling, or ask a site admin to create the "
                                          "account first"]})
    return user


def _role(role: str) -> Role:
    try:
        return Role(role)
    except ValueError:
        raise RuleViolation({"role": [f"must be one of {', '.join(Role.values)}"]}) from None


def _snapshot(m: Membership) -> dict:
    return {"user": m.user.username, "role": m.role,
            "default_exclusion": m.default_exclusion.label if m.default_exclusion_id else None,
            "default_affinity": m.default_affinity.label if m.default_affinity_id else None}


def add_member(team: Team, by: audit.Actor, who: str, role: str = Role.MEMBER) -> Membership:
    user = find_user(who)
    role = _role(role)
    if Membership.objects.filter(team=team, user=user).exists():
        current = Membership.objects.get(team=team, user=user).get_role_display().lower()
        raise RuleViolation({"user": [f"{user.username} is already in team {team.slug} (as {current}); "
                                          "change their role instead"]})
    try:
        with transaction.atomic():
            m = Membership.objects.create(team=team, user=user, role=role)
            audit.record(by, object_type="membership", object_id=m.pk, object_repr=f"{user.username} in {team.slug}",
                         team=team, action="added", after=_snapshot(m), message=effect_of(role, user.username, team))
    except IntegrityError:  # added by someone else meanwhile
        raise RuleViolation({"user": [f"{user.username} is already in team {team.slug}"]}) from None
    return m


def _other_admins(m: Membership) -> bool:
    return Membership.objects.filter(team_id=m.team_id, role=Role.ADMIN).exclude(pk=m.pk).exists()


def change_role(m: Membership, by: audit.Actor, role: str) -> Membership:
    role = _role(role)
    with transaction.atomic():
        m = Membership.objects.select_for_update().select_related("team", "user").get(pk=m.pk)
        if m.role == role:
            return m
        if m.role == Role.ADMIN and not _other_admins(m):
            raise RuleViolation({"role": [f"{m.user.username} is team {m.team.slug}'s only admin; make someone else "
                                              "admin first"]})
        before = _snapshot(m)
        m.role = role
        m.save(update_fields=["role"])
        audit.record(by, object_type="membership", object_id=m.pk, object_repr=f"{m.user.username} in {m.team.slug}",
                     team=m.team, action="role changed", before={"role": before["role"]}, after={"role": role},
                     message=effect_of(role, m.user.username, m.team))
    return m


def remove_member(m: Membership, by: audit.Actor, effect: str) -> str:
    """`effect`: what the removal does to the member's reservations (team_effects.member_removal),
    audited with it and returned, as said to the admin."""
    with transaction.atomic():
        m = Membership.objects.select_for_update().select_related("team", "user").get(pk=m.pk)
        if m.role == Role.ADMIN and not _other_admins(m):
            raise RuleViolation({"user": [f"{m.user.username} is team {m.team.slug}'s only admin; make someone else "
                                              "admin first"]})
        audit.record(by, object_type="membership", object_id=m.pk, object_repr=f"{m.user.username} in {m.team.slug}",
                     team=m.team, action="removed", before=_snapshot(m), message=effect)
        m.delete()
    return effect


def set_defaults(m: Membership, by: audit.Actor, *, exclusion: str | None, affinity: str | None) -> Membership:
    """The member's default exclusion group and affinity label (labels of the member's team;
    blank: none). Applies to their next requests; running ones keep theirs."""
    errors: dict[str, list[str]] = {}
    group = label = None
    if exclusion:
        group = ExclusionGroup.objects.filter(team_id=m.team_id, label=exclusion).first()
        if group is None:
            errors["default_exclusion"] = [f"team {m.team.slug} has no exclusion group '{exclusion}'; create it first"]
    if affinity:
        label = AffinityLabel.objects.filter(team_id=m.team_id, label=affinity).first()
        if label is None:
            errors["default_affinity"] = [f"team {m.team.slug} has no affinity label '{affinity}'; create it first"]
    if errors:
        raise RuleViolation(errors)
    with transaction.atomic():
        m = (Membership.objects.select_for_update(of=("self",))
             .select_related("team", "user", "default_exclusion", "default_affinity").get(pk=m.pk))
        before = _snapshot(m)
        m.default_exclusion, m.default_affinity = group, label
        m.save(update_fields=["default_exclusion", "default_affinity"])
        old, new = audit.changed(before, _snapshot(m))
        if new:
            audit.record(by, object_type="membership", object_id=m.pk,
                         object_repr=f"{m.user.username} in {m.team.slug}", team=m.team, action="defaults changed",
                         before=old, after=new, message="applies to their next requests")
    return m


def defaults_for(user, team: Team) -> dict[str, str]:
    """What the request page pre-fills for `user` in `team`: {"exclusion": ..., "affinity": ...}."""
    m = (Membership.objects.filter(user=user, team=team).select_related("default_exclusion", "default_affinity")
         .first())
    if m is None:
        return {"exclusion": "", "affinity": ""}
    return {"exclusion": m.default_exclusion.label if m.default_exclusion_id else "",
            "affinity": m.default_affinity.label if m.default_affinity_id else ""}
