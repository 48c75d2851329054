"""Fixtures of the deployment tests: compose.yaml as compose reads it with an empty environment."""

import pytest

from tests.unit.deploy.helpers import load_compose


@pytest.fixture(scope="session")
def compose() -> dict:
    return load_compose()


@pytest.fixture(scope="session")
def services(compose) -> dict:
    return compose["services"]
