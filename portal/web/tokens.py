"""Your API tokens (`/tokens/`): each by name, prefix, when it was made and last used; make one
(its key is shown once, on the answer to the form, never again) and revoke your own. The same
services as `/api/v1/tokens/`; another user's token is 404."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from portal.tenancy import services
from portal.tenancy.models import ApiToken

from . import navigation


class NewTokenForm(forms.Form):
    name = forms.CharField(max_length=80, label="Name", help_text="what it is for, e.g. laptop or ci",
                           error_messages={"required": "Give the token a name, e.g. laptop or ci.",
                                           "max_length": "A token name has at most 80 characters."})
    replace = forms.BooleanField(required=False, label="Replace my token of this name (revokes it)")


@never_cache  # the answer that shows a new key must not stay in any cache
@login_required
@require_http_methods(["GET", "POST"])
def tokens_page(request):
    form = NewTokenForm(request.POST or None)
    made = key = replaced = None
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                made, key, replaced = services.replace_token(request.user, form.cleaned_data["name"],
                                                             replace=form.cleaned_data["replace"])
            except services.TokenNameTaken as exc:
                form.add_error("name", str(exc)[0].upper() + str(exc)[1:] + " (tick “Replace”).")
        if made is None:
            status = 400
        else:
            form = NewTokenForm()
    tokens = ApiToken.objects.filter(user=request.user).order_by("revoked_at", "-created_at")
    return render(request, "web/tokens.html", {"form": form, "made": made, "key": key, "replaced": replaced,
                                               "live": [t for t in tokens if t.revoked_at is None],
                                               "revoked": [t for t in tokens if t.revoked_at is not None][:20]},
                  status=status)


@login_required
@require_POST
def revoke_token_page(request, pk: int):
    token = ApiToken.objects.filter(pk=pk, user=request.user, revoked_at__isnull=True).first()
    if token is None:
        raise Http404("no such token")
    services.revoke_token(token)
    messages.success(request, f"Token “{token.name}” ({token.prefix}…) revoked: it no longer signs anything in.")
    return redirect("tokens")


navigation.register("API tokens", "tokens", order=88)
