"""Fixtures of the documentation's tests: the schema generator and its schemas."""

from __future__ import annotations

from types import ModuleType

import pytest
from docs_generator import load_generator


@pytest.fixture(scope="session")
def gen() -> ModuleType:
    return load_generator()


@pytest.fixture(scope="session")
def schemas(gen) -> dict:
    """Every format's schema as generated from the models now."""
    return gen.available()
