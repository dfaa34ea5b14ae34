"""Headless Chromium (Debian's, at /usr/bin/chromium) driven by Playwright against a live server."""

import os
import shutil

import pytest

CHROMIUM = os.environ.get("TESSERA_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def chromium():
    """Module-scoped: Playwright's sync API keeps an event loop running in this thread, so while it
    lives Django must be told that its sync ORM calls here are safe; both end with the module."""
    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make setup-test` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"],
        )
        yield browser
        browser.close()
    del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]


@pytest.fixture
def page(chromium):
    context = chromium.new_context()
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


# The real stack (Daphne, Celery on Redis, agents) for the data scientist's flows.
from tests.integration.conftest import redis_layer  # noqa: E402, F401

from .stack import stack  # noqa: E402, F401
