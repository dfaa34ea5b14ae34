"""The apps a preset or a request may declare, and the port each listens on unless told otherwise."""

from __future__ import annotations

from django.db import models


class AppKind(models.TextChoices):
    NONE = "", "None"
    JUPYTER = "jupyter", "Jupyter"
    VSCODE = "vscode", "VS Code server"
    TENSORBOARD = "tensorboard", "TensorBoard"
    PORT = "port", "A port"


DEFAULT_PORTS = {AppKind.JUPYTER: 8888, AppKind.VSCODE: 8080, AppKind.TENSORBOARD: 6006}
# Where Open leads under the app's base URL: Jupyter's own "/" is jupyter-server's bare landing
# page; /tree is Jupyter Notebook 7's file browser (New → a notebook), served by the local backend's
# jupyter-server (the notebook package) and by the Jupyter Docker Stacks images alike.
ENTRY_PATHS = {AppKind.JUPYTER: "tree"}


def app_problems(app: str, port: int | None) -> dict[str, list[str]]:
    """Per-field problems with an app declaration, in the user's words."""
    if app not in AppKind.values:
        return {"app": [f"choose one of {', '.join(v for v in AppKind.values if v)}, or none"]}
    if port is not None and not (1024 <= port <= 65535):
        return {"app_port": ["a port between 1024 and 65535"]}
    if app == AppKind.PORT and port is None:
        return {"app_port": ["give the port your app listens on (1024-65535)"]}
    if not app and port is not None:
        return {"app_port": ["choose an app first; a port alone opens nothing"]}
    return {}


def app_port_of(app: str, port: int | None) -> int | None:
    """The port the app listens on: the one given, or its kind's default (None: no app)."""
    if not app:
        return None
    return port if port is not None else DEFAULT_PORTS.get(AppKind(app))
