# Load the Celery app with Django so that shared tasks bind to it (and `celery -A portal` finds it).
from .celery import app as celery_app

__all__ = ["celery_app"]
