from django.urls import path

from . import views

urlpatterns = [
    path("notifications/", views.notifications_page, name="notifications"),
    path("notifications/<int:pk>/read/", views.read_notification, name="read-notification"),
    path("notifications/read-all/", views.read_all, name="read-all-notifications"),
    path("notifications/settings/", views.preferences_page, name="notification-preferences"),
    path("notifications/mail/", views.demo_mail, name="demo-mail"),
]
