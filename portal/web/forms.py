"""The request form in human units (GiB, hours, a shell-like command line) and the extend form.

Field names are what people see; `spec()` turns a valid form into the ReservationSpec the
reservation rules check, and `add_rule_errors` puts the rules' messages back on the field the
person typed into, in their words."""

from __future__ import annotations

import re
import shlex
from decimal import Decimal

from django import forms

from portal.connect.kinds import AppKind
from portal.fleet.model_names import display_model
from portal.reservations import rules
from portal.reservations.models import Kind, Reservation
from portal.tenancy import roles
from portal.tenancy.members import defaults_for
from portal.tenancy.models import AffinityLabel, ExclusionGroup, Team
from portal.tenancy.policy import policy_of

from .units import HOURS, say_in, speak_units

MIB_PER_GIB = 1024

# ReservationSpec field → the form field a person filled in.
FIELD_OF = {"gpu_memory_mib": "memory_gib", "max_duration_s": "hours", "starts_at": "book_start",
            "ends_at": "book_end", "duration_s": "hours", "repeat_weeks": "book_weeks"}
LOCAL_MINUTE = "%Y-%m-%dT%H:%M"  # a datetime-local input's value (times on the page are UTC)
# Internal names inside rule messages → words.
WORDS = {
    "gpu_request": "the GPU share", "gpu_limit": "the limit", "gpu_memory_mib": "memory",
    "gpu_count": "the number of GPUs", "group_headcount": "the headcount", "group_threshold": "the threshold",
    "group_name": "the pod group", "max_duration_s": "the duration", "app_port": "the app port",
}
_MIB = re.compile(r"\b(\d+) MiB\b")


def in_words(message: str) -> str:
    for name, words in WORDS.items():
        message = message.replace(name, words)
    return _MIB.sub(lambda m: _gib_text(int(m.group(1))), message)


def _gib_text(mib: int) -> str:
    gib = mib / MIB_PER_GIB
    return f"{gib:g} GiB" if mib >= MIB_PER_GIB else f"{mib} MiB"


def submit_teams(user):
    teams = roles.visible_teams(user)
    if not user.is_staff:
        teams = teams.filter(id__in=[t for t, r in roles.team_roles(user).items() if r in roles.SUBMIT_ROLES])
    return teams.order_by("slug")


class GpuModelField(forms.ChoiceField):
    """A model by its display name (the choices) or its label-safe name (as in kubectl labels)."""

    def to_python(self, value):
        return display_model(super().to_python(value))


class RequestForm(forms.Form):
    team = forms.ModelChoiceField(queryset=Team.objects.none(), to_field_name="slug", empty_label=None,
                                  error_messages={"invalid_choice": "Choose one of your teams."})
    kind = forms.ChoiceField(choices=Kind.choices, initial=Kind.INTERACTIVE, widget=forms.RadioSelect,
                             label="What for")
    name = forms.CharField(max_length=63, required=False, label="Name (optional)",
                           widget=forms.TextInput(attrs={"placeholder": "e.g. resnet-sweep"}))
    image = forms.CharField(max_length=255, initial="jupyter/base-notebook:latest", label="Container image")
    command = forms.CharField(max_length=4096, required=False, label="Command (optional)",
                              help_text="As you would type it in a shell; quotes group words.",
                              widget=forms.TextInput(attrs={"placeholder": "python train.py --epochs 10",
                                                            "spellcheck": "false"}))
    gpu_model = GpuModelField(required=False, label="GPU model")
    gpu_request = forms.DecimalField(min_value=Decimal("0.01"), max_value=1, decimal_places=2, initial="0.25",
                                     label="GPU share", help_text="Guaranteed fraction of one GPU (0.01–1).",
                                     widget=forms.NumberInput(attrs={"step": "0.05"}),
                                     error_messages={"min_value": "Ask for at least 0.01 of a GPU.",
                                                     "max_value": "A share is at most one whole GPU (1).",
                                                     "max_decimal_places": "Use at most two decimals (e.g. 0.25)."})
    gpu_limit = forms.DecimalField(min_value=Decimal("0.01"), max_value=1, decimal_places=2, required=False,
                                   label="Limit when idle",
                                   help_text="Up to this when the GPU is idle; blank: the share.",
                                   widget=forms.NumberInput(attrs={"step": "0.05"}),
                                   error_messages={"max_value": "The limit is at most one whole GPU (1)."})
    memory_gib = forms.DecimalField(min_value=Decimal("0.25"), max_value=1024, decimal_places=2, initial="8",
                                    label="GPU memory (GiB)", widget=forms.NumberInput(attrs={"step": "0.5"}),
                                    error_messages={"min_value": "Ask for at least 0.25 GiB of GPU memory."})
    gpu_count = forms.IntegerField(min_value=1, max_value=64, initial=1, label="GPUs",
                                   help_text="More than one takes whole cards.")
    hours = forms.DecimalField(min_value=Decimal("0.02"), max_value=720, decimal_places=2, required=False,
                               label="For how long (hours)", help_text="Blank: the team's default.",
                               widget=forms.NumberInput(attrs={"step": "0.5"}),
                               error_messages={"min_value": "Ask for at least a minute (0.02 h).",
                                               "max_value": "At most 30 days (720 h)."})
    # Advanced
    priority = forms.IntegerField(min_value=0, max_value=100, initial=50, label="Priority",
                                  help_text="0 = opportunistic: may run beyond the quota, may be preempted.")
    exclusion = forms.ChoiceField(required=False, label="Exclusion group",
                                  help_text="Never share a GPU with other work of this group.")
    affinity = forms.ChoiceField(required=False, label="Share GPUs with")
    anti_affinity = forms.ChoiceField(required=False, label="Keep away from")
    group_name = forms.CharField(max_length=63, required=False, label="Pod group (gang)")
    group_headcount = forms.IntegerField(min_value=1, max_value=1024, required=False, label="Headcount")
    group_threshold = forms.DecimalField(min_value=Decimal("0.01"), max_value=1, decimal_places=2, required=False,
                                         label="Start when this fraction is placed")
    remote_allowed = forms.BooleanField(
        required=False, label="May use a GPU on another node (remote share)",
        help_text="When no node has room for the pod and the share, the pod may run on another node and use "
                  "the share over the network. Only for shares below one GPU; the team's policy must allow it.")

    app = forms.ChoiceField(choices=AppKind.choices, required=False, label="Open in the browser",
                            help_text="The portal opens this app in your pod with one click (Open).")
    app_port = forms.IntegerField(min_value=1024, max_value=65535, required=False, label="App port (optional)",
                                  help_text="Blank: the app's usual port.",
                                  error_messages={"min_value": "Use a port from 1024 to 65535.",
                                                  "max_value": "Use a port from 1024 to 65535."})

    # Book ahead: a window in the future (the hours above, or an end), repeated weekly.
    book_start = forms.DateTimeField(
        required=False, label="Starts (UTC)", input_formats=[LOCAL_MINUTE, "%Y-%m-%d %H:%M"],
        help_text="Blank: as soon as possible. A start up to 90 days ahead books the share for that window.",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format=LOCAL_MINUTE))
    book_end = forms.DateTimeField(
        required=False, label="Ends (UTC)", input_formats=[LOCAL_MINUTE, "%Y-%m-%d %H:%M"],
        help_text="Blank: the start plus the hours above.",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format=LOCAL_MINUTE))
    book_weeks = forms.IntegerField(min_value=1, max_value=12, required=False, initial=1,
                                    label="Weeks (repeat weekly)", help_text="1: once; up to 12 weeks in a row.",
                                    error_messages={"max_value": "Repeat a booking at most 12 weeks."})

    BOOKING = ("book_start", "book_end", "book_weeks")
    ADVANCED = ("priority", "exclusion", "affinity", "anti_affinity", "group_name", "group_headcount",
                "group_threshold", "remote_allowed")

    UNITS = {"gpu_request": "of a GPU", "gpu_limit": "of a GPU", "memory_gib": "GiB", "gpu_count": "GPUs",
             "hours": "h", "group_headcount": "pods", "group_threshold": "of the group"}

    def __init__(self, *args, user, models: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        speak_units(self, self.UNITS)
        self.user = user
        teams = submit_teams(user)
        self.fields["team"].queryset = teams
        # Another team has other labels, limits and priorities: the form is fetched again for it.
        self.fields["team"].widget.attrs.update({
            "hx-get": "/reservations/new/", "hx-trigger": "change", "hx-target": "#request-form",
            "hx-select": "#request-form", "hx-swap": "outerHTML", "hx-include": "#request-form",
            "hx-params": "not csrfmiddlewaretoken"})
        mine = list(teams)  # one query; the field's own validation queries again by slug
        first = mine[0] if mine else None
        if first is not None and not self.initial.get("team"):
            self.fields["team"].initial = first.slug
        self.fields["gpu_model"].choices = [("", "Any model")] + [(m, m) for m in models]
        team = self._chosen_team(mine) or first
        self.team = team
        exclusions = [e.label for e in ExclusionGroup.objects.filter(team=team)] if team else []
        labels = [a.label for a in AffinityLabel.objects.filter(team=team)] if team else []
        self.fields["exclusion"].choices = [("", "None")] + [(x, x) for x in exclusions]
        self.fields["affinity"].choices = [("", "No preference")] + [(x, x) for x in labels]
        self.fields["anti_affinity"].choices = [("", "No preference")] + [(x, x) for x in labels]
        self.policy = policy_of(team) if team is not None else None
        if team is not None:  # the groups a team admin set as this member's defaults (portal.tenancy.members)
            for name, value in defaults_for(user, team).items():
                self.fields[name].initial = self.fields[name].initial or value
        if team is not None:
            self.max_priority = 100 if user.is_staff else self.policy.max_priority(roles.role_in(user, team))
            self.max_hours = self.policy.max_duration_s / 3600
            self.fields["priority"].max_value = self.max_priority
            self.fields["priority"].widget.attrs["max"] = self.max_priority
            self.fields["priority"].help_text = (f"0 = opportunistic (may run beyond the quota, may be preempted); "
                                                 f"your role in {team.slug} allows up to {self.max_priority}.")
            if self.fields["priority"].initial > self.max_priority:
                self.fields["priority"].initial = self.max_priority
            self.fields["hours"].help_text = f"Blank: the team's default. Team {team.slug} allows up to " \
                                             f"{self.max_hours:g} h."
            if not self.policy.allow_remote:
                self.fields["remote_allowed"].help_text = f"Team {team.slug} does not allow remote shares."
                self.fields["remote_allowed"].disabled = True

    def _chosen_team(self, teams: list[Team]) -> Team | None:
        slug = self.data.get("team") if self.is_bound else self.initial.get("team")
        return next((t for t in teams if t.slug == slug), None) if slug else None

    def advanced_fields(self):
        return [self[name] for name in self.ADVANCED]

    def basic_fields(self):
        return [self[name] for name in self.fields if name not in self.ADVANCED and name not in self.BOOKING]

    def window(self):
        """The booking's window (services.window_of), or None for a request that starts now.
        Raises RuleViolation in the API's field names."""
        from portal.reservations import services

        d = self.cleaned_data
        if d.get("book_start") is None:
            if d.get("book_end") is not None:
                raise rules.RuleViolation({"book_end": ["Give the start too, or leave the end blank."]})
            return None
        end, hours = d.get("book_end"), d.get("hours")
        if end is None and hours is None:
            raise rules.RuleViolation({"ends_at": ["give the end, or the hours it lasts"]})
        return services.window_of(d["book_start"], end, int(hours * 3600) if end is None else None,
                                  d.get("book_weeks") or 1)

    def clean_command(self) -> list[str]:
        text = self.cleaned_data.get("command") or ""
        try:
            return shlex.split(text)
        except ValueError as exc:
            raise forms.ValidationError(f"The command could not be split like a shell would: {exc} "
                                        "(close every quote).") from None

    def clean_priority(self) -> int:
        value = self.cleaned_data["priority"]
        if value > getattr(self, "max_priority", 100):
            raise forms.ValidationError(f"Your role lets you use priority up to {self.max_priority}.")
        return value

    def clean(self):
        data = super().clean()
        share, limit = data.get("gpu_request"), data.get("gpu_limit")
        if share is not None and limit is not None and limit < share:
            self.add_error("gpu_limit", f"The limit can't be below the share you ask for ({share}).")
        count = data.get("gpu_count")
        if count and count > 1 and share is not None and share != 1:
            self.add_error("gpu_request", "With more than one GPU you get whole cards: set the share to 1.")
        hours = data.get("hours")
        if hours is not None and self.policy is not None and not self.user.is_staff \
                and hours * 3600 > self.policy.max_duration_s:
            self.add_error("hours", f"Team {self.team.slug} allows at most {self.max_hours:g} h.")
        if data.get("group_name") and not data.get("group_headcount"):
            self.add_error("group_headcount", "A pod group needs a headcount.")
        if data.get("remote_allowed") and ((count and count > 1) or (share is not None and share >= 1)):
            self.add_error("remote_allowed", "Only a share below one GPU can be remote: lower the share or "
                                             "leave this off.")
        return data

    def spec(self) -> rules.ReservationSpec:
        d = self.cleaned_data
        hours = d.get("hours")
        count = d.get("gpu_count") or 1
        share = d["gpu_request"]
        limit = d.get("gpu_limit")
        if count > 1:
            share, limit = Decimal(1), Decimal(1)
        return rules.ReservationSpec(
            team=d["team"], image=d["image"].strip(), gpu_request=share, gpu_limit=limit,
            gpu_memory_mib=int(d["memory_gib"] * MIB_PER_GIB), gpu_count=count, gpu_model=d.get("gpu_model") or "",
            priority=d["priority"] if d.get("priority") is not None else 50, kind=d["kind"],
            name=d.get("name") or "", command=d.get("command") or [],
            affinity=d.get("affinity") or "", anti_affinity=d.get("anti_affinity") or "",
            exclusion=d.get("exclusion") or "", group_name=d.get("group_name") or "",
            group_headcount=d.get("group_headcount") if d.get("group_name") else None,
            group_threshold=d.get("group_threshold") if d.get("group_name") else None,
            max_duration_s=int(hours * 3600) if hours is not None else None,
            remote_allowed=bool(d.get("remote_allowed")),
            app=d.get("app") or "", app_port=d.get("app_port"),
        )

    def add_rule_errors(self, errors: dict[str, list[str]]) -> None:
        for name, problems in errors.items():
            field = FIELD_OF.get(name, name)
            for problem in problems:
                if field == "hours":
                    problem = say_in(problem, HOURS)
                self.add_error(field if field in self.fields else None, in_words(problem))


def initial_from(reservation: Reservation) -> dict:
    """The form's values for "request again"."""
    return {
        "team": reservation.team.slug, "kind": reservation.kind, "name": reservation.name, "image": reservation.image,
        "command": shlex.join(reservation.command or []), "gpu_model": reservation.gpu_model,
        "gpu_request": reservation.gpu_request.normalize(), "gpu_limit": reservation.gpu_limit.normalize(),
        "memory_gib": Decimal(reservation.gpu_memory_mib) / MIB_PER_GIB, "gpu_count": reservation.gpu_count,
        "hours": (Decimal(reservation.max_duration_s) / 3600).quantize(Decimal("0.01")).normalize()
        if reservation.max_duration_s else None,
        "priority": reservation.priority, "exclusion": reservation.exclusion, "affinity": reservation.affinity,
        "anti_affinity": reservation.anti_affinity, "group_name": reservation.group_name,
        "group_headcount": reservation.group_headcount, "group_threshold": reservation.group_threshold,
        "remote_allowed": reservation.remote_allowed,
        "app": reservation.app, "app_port": reservation.app_port,
    }


def initial_from_preset(preset) -> dict:
    return {
        "team": preset.team.slug, "kind": preset.kind, "image": preset.image,
        "command": shlex.join(preset.command or []), "gpu_model": preset.gpu_model,
        "gpu_request": preset.gpu_request.normalize(), "gpu_limit": preset.gpu_limit.normalize(),
        "memory_gib": Decimal(preset.gpu_memory_mib) / MIB_PER_GIB,
        "hours": (Decimal(preset.max_duration_s) / 3600).quantize(Decimal("0.01")).normalize()
        if preset.max_duration_s else None,
        "app": preset.app, "app_port": preset.app_port,
    }


class ExtendForm(forms.Form):
    hours = forms.DecimalField(min_value=Decimal("0.25"), max_value=720, decimal_places=2, initial="1",
                               label="Add hours", widget=forms.NumberInput(attrs={"step": "0.5"}),
                               error_messages={"min_value": "Add at least a quarter of an hour (0.25).",
                                               "max_value": "At most 720 hours at once."})

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        speak_units(self, {"hours": "h"})
