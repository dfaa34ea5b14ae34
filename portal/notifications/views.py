"""Pages: a person's notifications (read one, read all), their preferences and, in demo mode, the
mails the demo "sent" them. Every page shows only the signed-in person's own: another person's
notification is 404."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from . import mail, preferences, services
from .forms import PreferencesForm
from .live import unread_count
from .models import Channel, Notification

PAGE_SIZE = 30


@login_required
def notifications_page(request):
    shown = Notification.objects.filter(user=request.user, in_app=True).select_related("reservation")
    page = Paginator(shown, PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "notifications/list.html", {
        "page": page, "unread": unread_count(request.user.pk), "demo": settings.DEMO_MODE})


@login_required
@require_POST
def read_notification(request, pk: int):
    """Mark one read; with `open`, go on to its reservation."""
    n = get_object_or_404(Notification, pk=pk, user=request.user)
    services.mark_read(request.user, n.pk)
    if "open" in request.POST and n.reservation_id:
        return redirect("reservation", n.reservation_id)
    return redirect("notifications")


@login_required
@require_POST
def read_all(request):
    count = services.mark_all_read(request.user)
    messages.success(request, f"Marked {count} notification{'s' if count != 1 else ''} read.")
    return redirect("notifications")


@login_required
@require_http_methods(["GET", "POST"])
def preferences_page(request):
    prefs = preferences.of([request.user.pk])[request.user.pk]
    form = PreferencesForm(request.POST or None, prefs=prefs)
    if request.method == "POST" and form.is_valid():
        preferences.save(request.user, form.channels(), form.cleaned_data["waiting_after_min"],
                         form.cleaned_data["webhook_url"])
        messages.success(request, "Saved: you will be told as you chose.")
        return redirect("notification-preferences")
    return render(request, "notifications/preferences.html", {
        "form": form, "channels": Channel.choices, "email": request.user.email}, status=400 if form.errors else 200)


@login_required
def demo_mail(request):
    """The demo's mails to the signed-in person (the file backend's var/mail/); demo mode only."""
    if not settings.DEMO_MODE:
        raise Http404("only in the demo")
    return render(request, "notifications/mail.html", {
        "mails": mail.demo_mails(request.user.email), "email": request.user.email})

