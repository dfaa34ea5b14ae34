from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "portal.notifications"
    label = "notifications"

    def ready(self) -> None:
        from . import subscribers  # noqa: F401  (connects to the reservation events)
