from django.contrib.auth import views as auth_views
from django.urls import path

from . import views

urlpatterns = [
    path("", views.reservations, name="home"),
    path("reservations/new/", views.new_reservation, name="new-reservation"),
    path("reservations/<int:pk>/cancel/", views.cancel_reservation, name="cancel-reservation"),
    path("login/", auth_views.LoginView.as_view(template_name="web/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
]
