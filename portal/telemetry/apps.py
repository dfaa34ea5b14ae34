from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    name = "portal.telemetry"
    label = "telemetry"
    verbose_name = "GPU telemetry"

    def ready(self) -> None:
        from . import live_fleet, live_reservations, signals  # noqa: F401  (connect the push receivers)
