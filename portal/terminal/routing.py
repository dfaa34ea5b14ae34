"""WebSocket route of the terminal (mounted by portal/asgi.py)."""

from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from .consumer import TerminalConsumer

websocket_urlpatterns = [
    # The session cookie, and the Origin checked against ALLOWED_HOSTS (no cross-site use).
    path("ws/terminal/<int:reservation_id>/",
         AllowedHostsOriginValidator(AuthMiddlewareStack(TerminalConsumer.as_asgi()))),
]
