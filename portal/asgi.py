"""ASGI entry: HTTP through Django, WebSockets through Channels (routes added by the apps)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django_asgi_app = get_asgi_application()

from django.conf import settings  # noqa: E402

if settings.DEBUG:
    # Daphne run by hand (tests, development) serves /static/ as `runserver` does; production
    # serves it through WhiteNoise instead.
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    django_asgi_app = ASGIStaticFilesHandler(django_asgi_app)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402  (needs Django set up first)

from portal.connect.proxy import ConnectProxy  # noqa: E402
from portal.telemetry.routing import websocket_urlpatterns  # noqa: E402
from portal.terminal.routing import websocket_urlpatterns as terminal_urlpatterns  # noqa: E402

# Each route brings its own authentication: agents a node token, browsers the session (with the
# Origin check), so the two cannot be confused.
application = ProtocolTypeRouter({"http": django_asgi_app,
                                  "websocket": URLRouter(websocket_urlpatterns + terminal_urlpatterns)})
# /connect/<reservation id>/: the reservations' apps, HTTP and WebSockets, proxied (the session as
# the pages use it, checked per request).
application = ConnectProxy(application)

import gc  # noqa: E402

# What is loaded by now (Django, the apps, their libraries) lives as long as the process: leave
# it out of the cyclic collector's full passes, which come every few seconds under ingest load
# and would otherwise walk all of it each time, pausing every connection of the process.
gc.freeze()
