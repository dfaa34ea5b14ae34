from django.apps import AppConfig


class PlacementConfig(AppConfig):
    name = "portal.placement"
    label = "placement"
