from decimal import Decimal

from django import forms

from portal.fleet.model_names import display_model
from portal.reservations.models import Kind
from portal.tenancy import roles
from portal.tenancy.models import Team


class GpuModelField(forms.ChoiceField):
    """A model by its display name (the choices) or its label-safe name (as in kubectl labels)."""

    def to_python(self, value):
        return display_model(super().to_python(value))


class ReservationForm(forms.Form):
    team = forms.ModelChoiceField(queryset=Team.objects.none(), to_field_name="slug")
    kind = forms.ChoiceField(choices=Kind.choices, initial=Kind.INTERACTIVE)
    name = forms.CharField(max_length=63, required=False)
    image = forms.CharField(max_length=255, initial="jupyter/base-notebook:latest")
    command = forms.CharField(max_length=4096, required=False, help_text="Arguments separated by spaces")
    gpu_request = forms.DecimalField(min_value=Decimal("0.001"), max_value=1, decimal_places=3, initial="0.25",
                                     label="GPU share (request)")
    gpu_limit = forms.DecimalField(min_value=Decimal("0.001"), max_value=1, decimal_places=3, required=False,
                                   label="GPU share limit (idle boost)")
    gpu_memory_mib = forms.IntegerField(min_value=1, initial=8192, label="GPU memory (MiB)")
    gpu_count = forms.IntegerField(min_value=1, max_value=64, initial=1, label="GPUs")
    gpu_model = GpuModelField(required=False, label="GPU model")
    priority = forms.IntegerField(min_value=0, max_value=100, initial=50, help_text="0 = opportunistic")
    max_duration_s = forms.IntegerField(min_value=60, max_value=30 * 86400, required=False,
                                        label="Maximum duration (s)")

    def __init__(self, *args, user, models: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        teams = roles.visible_teams(user)
        if not user.is_staff:
            teams = teams.filter(id__in=[t for t, r in roles.team_roles(user).items() if r in roles.SUBMIT_ROLES])
        self.fields["team"].queryset = teams
        if teams.count() == 1:
            self.fields["team"].initial = teams.first().slug
        self.fields["gpu_model"].choices = [("", "any")] + [(m, m) for m in models]

    def spec_fields(self) -> dict:
        data = dict(self.cleaned_data)
        data["command"] = data["command"].split() if data["command"] else []
        return data
