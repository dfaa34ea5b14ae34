import pytest


@pytest.fixture(autouse=True)
def _fresh_preview_snapshot():
    """The preview keeps the fleet snapshot for two seconds per process; each test has its own fleet."""
    from portal.web import preview

    preview.forget_snapshot()
    yield
    preview.forget_snapshot()
