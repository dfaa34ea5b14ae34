"""Gunicorn's settings for the portal's HTTP side: pages, fragments, the API, /metrics.

    gunicorn -c python:portal.web_server -b 0.0.0.0:8000

WebSockets (ws/live/, ws/agents/) stay with Daphne (`python -m portal.serve`), on their own
processes: deploy/ routes /ws/ there. HTTP is served through WSGI because Django's ASGI handler
runs each synchronous view on a thread it makes for that request, plus tasks to watch for the
client leaving; under bench/load that cost about a third more CPU per API request than Gunicorn's
threads, and the request threads of a Daphne process also competed with its agents' streams.
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

from django.conf import settings  # after the settings module is named

wsgi_app = "portal.wsgi:application"
workers = settings.TESSERA_WEB_PROCESSES
worker_class = "gthread"
threads = settings.TESSERA_WEB_THREADS
# Connections that wait for a thread queue in the kernel, not in Python.
backlog = 2048
keepalive = 5
# A worker silent this long (a request stuck past every database and cluster timeout) is replaced.
timeout = 60
graceful_timeout = 20
# Bounded request heads: a longer line or header is answered 400 before Django sees it.
limit_request_line = 8190
limit_request_fields = 100
limit_request_field_size = 8190
accesslog = None
errorlog = "-"


def post_worker_init(worker) -> None:
    """Import the URL configuration, and with it every view, before the worker takes a request:
    Django does it on the first request, which then took 2–6 s on a 2-core machine. Then leave
    all that is loaded (it lives as long as the process) out of the cyclic collector's full
    passes: in process, a full pass over it took ~130 ms in the middle of a request, and the
    collector's passes cost ~0.5 ms of CPU per API request; frozen, ~7 ms and ~0.27 ms."""
    import gc

    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018  (the property imports them)
    gc.freeze()
