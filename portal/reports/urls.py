from django.urls import path

from . import views

urlpatterns = [
    path("reports/", views.usage_page, name="reports"),
    path("reports/overview/", views.overview_page, name="reports-overview"),
]
