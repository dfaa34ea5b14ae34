from django.urls import path

from . import views

urlpatterns = [
    path("telemetry/live/state/", views.live_state, name="telemetry-live-state"),
    path("metrics", views.metrics, name="metrics"),
]
