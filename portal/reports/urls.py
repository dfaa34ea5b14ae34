from django.urls import path

from . import views

urlpatterns = [path("reports/", views.utilization_page, name="reports")]
