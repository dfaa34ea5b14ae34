"""JSON error pages for API paths (HTML for the rest), so API clients never get HTML."""

import sys

from django.http import JsonResponse
from django.views.defaults import page_not_found
from django.views.defaults import server_error as html_server_error

from portal.security import unavailable


def not_found(request, exception):
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found.", "code": "not_found"}, status=404)
    return page_not_found(request, exception)


def server_error(request):
    # Called while the exception is being handled: a failure outside the API views (a middleware
    # loading the session's user, a page) that is the database being unavailable is a 503.
    exc = sys.exc_info()[1]
    if unavailable.is_database_unavailable(exc):
        return unavailable.response(request, exc)
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Internal error; it has been logged.", "code": "server_error"}, status=500)
    return html_server_error(request)
