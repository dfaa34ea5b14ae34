"""JSON error pages for API paths (HTML for the rest), so API clients never get HTML."""

from django.http import JsonResponse
from django.views.defaults import page_not_found
from django.views.defaults import server_error as html_server_error


def not_found(request, exception):
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found.", "code": "not_found"}, status=404)
    return page_not_found(request, exception)


def server_error(request):
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Internal error; it has been logged.", "code": "server_error"}, status=500)
    return html_server_error(request)
