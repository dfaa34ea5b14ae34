from django.apps import AppConfig


class ReservationsConfig(AppConfig):
    name = "portal.reservations"
    label = "reservations"
