from django.contrib.auth import views as auth_views
from django.urls import path

from . import booking_pages, request_pages, reservation_pages, tokens, views, workloads

urlpatterns = [
    path("", views.home, name="home"),
    path("home/side/", views.home_side, name="home-side"),
    path("reservations/new/", request_pages.new_reservation, name="new-reservation"),
    path("reservations/new/preview/", request_pages.request_preview, name="request-preview"),
    path("reservations/new/preset/<int:pk>/", request_pages.request_preset, name="request-preset"),
    path("reservations/<int:pk>/", reservation_pages.reservation_page, name="reservation"),
    path("reservations/<int:pk>/card/", views.reservation_card, name="reservation-card"),
    path("reservations/<int:pk>/log/", reservation_pages.reservation_log, name="reservation-log"),
    path("reservations/<int:pk>/extend/", reservation_pages.extend_reservation, name="extend-reservation"),
    path("reservations/<int:pk>/cancel/", reservation_pages.cancel_reservation, name="cancel-reservation"),
    path("workloads/", workloads.workloads_page, name="workloads"),
    path("workloads/<int:pk>/cancel/", workloads.cancel_workload, name="workload-cancel"),
    path("workloads/<int:pk>/extend/", workloads.extend_workload, name="workload-extend"),
    path("tokens/", tokens.tokens_page, name="tokens"),
    path("tokens/<int:pk>/revoke/", tokens.revoke_token_page, name="revoke-token"),
    path("bookings/", booking_pages.bookings_page, name="bookings"),
    path("bookings/<int:pk>/cancel/", booking_pages.cancel_booking, name="cancel-booking"),
    path("bookings/<int:pk>/move/", booking_pages.move_booking, name="move-booking"),
    path("bookings/<int:pk>/delete/", booking_pages.delete_booking, name="delete-booking"),
    path("bookings/feed/", booking_pages.regenerate_feed, name="regenerate-feed"),
    path("bookings/feed/<str:token>.ics", booking_pages.feed, name="bookings-feed"),
    path("login/", auth_views.LoginView.as_view(template_name="web/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
]
