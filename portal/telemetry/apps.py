from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    name = "portal.telemetry"
    label = "telemetry"
    verbose_name = "GPU telemetry"

    def ready(self) -> None:
        from . import signals  # noqa: F401  (connects allocations_changed → push placements)
