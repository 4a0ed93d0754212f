from __future__ import annotations

import pytest

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
