from __future__ import annotations

import pytest

from tests.helm.ensure_tools import ensure_checkov_in_background
from tests.helm.helm_support import PRODUCTION_VALUES, Rendered, load_values, render


@pytest.fixture(scope="session")
def production_values() -> dict:
    return load_values(PRODUCTION_VALUES)


@pytest.fixture(scope="session")
def default_render() -> Rendered:
    return render()


@pytest.fixture(scope="session")
def production_render(production_values) -> Rendered:
    return render(production_values)


@pytest.fixture(scope="session", params=["default", "production"])
def any_render(request, default_render, production_render) -> Rendered:
    """Each test using this runs once per shipped configuration."""
    return default_render if request.param == "default" else production_render


def pytest_collection_modifyitems(session, config, items):
    """checkov takes a while to install the first time: start that now, so it overlaps the other
    chart tests (test_helm_security.py runs last in this directory and waits for it)."""
    if any(item.path.name == "test_helm_security.py" for item in items):
        ensure_checkov_in_background()
