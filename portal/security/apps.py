from django.apps import AppConfig


class SecurityConfig(AppConfig):
    """Guards that sit in front of the other apps: sign-in (demo credentials, throttles), database
    unavailability answers, response headers. No models."""

    name = "portal.security"
    label = "security"

    def ready(self) -> None:
        from . import checks  # noqa: F401 (registers the deployment checks)
