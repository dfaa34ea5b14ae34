from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("portal.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves Swagger UI's setup as a script file: no inline script (strict CSP).
    # (ReDoc is not offered: it needs inline script and injected style elements.)
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("", include("portal.telemetry.urls")),
    path("", include("portal.reports.urls")),
    path("", include("portal.web.admin_urls")),
    path("", include("portal.notifications.urls")),
    path("", include("portal.web.urls")),
]

handler404 = "portal.api.errors.not_found"
handler500 = "portal.api.errors.server_error"
