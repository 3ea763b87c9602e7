"""The fixtures the plugin gives scenario tests: `amp_device` and `record`."""

from __future__ import annotations

import pytest

from harness.common.errors import HarnessError
from harness.lab import devices
from harness.plugin.protocol import RECORD
from harness.plugin.session import state_of
from harness.records.record import Record


@pytest.fixture(scope="session")
def amp_device(pytestconfig: pytest.Config) -> devices.DeviceInfo:
    """The device this session's scenarios run on, with its probed capabilities."""
    return state_of(pytestconfig).device


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Record:
    """What this scenario test observed: params, metrics, histories, figures, verdicts."""
    if RECORD not in request.node.stash:
        raise HarnessError(
            f"{request.node.nodeid}: the `record` fixture is for scenario tests in "
            f"{state_of(request.config).scenarios}"
        )
    return request.node.stash[RECORD]
