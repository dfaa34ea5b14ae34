from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "portal.api"
    label = "api"
