"""Fixtures of the end-to-end tests: the official dstack client's virtualenv (see ``dstack_client_env``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from dstack_client_env import DSTACK_VERSION, ClientInstallError, client_venv


@pytest.fixture(scope="session")
def dstack_venv() -> Path:
    try:
        return client_venv()
    except ClientInstallError as e:
        pytest.fail(f"could not install dstack=={DSTACK_VERSION}:\n{e}", pytrace=False)
