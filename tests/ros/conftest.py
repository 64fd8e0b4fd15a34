"""pytest set-up for tests/ros: loopback-only DDS and a per-run domain id (see ros_helpers.py,
imported here before any DDS participant exists), plus the shared fixtures."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from ros_helpers import TEST_DOMAIN, RecordingSink  # noqa: E402


@pytest.fixture(autouse=True)
def no_registration_budget(monkeypatch):
    """The companions made in these tests do their registrations at once, however long the
    backend takes: the 10 ms budget is wall-clock time, so on a loaded machine a fake backend's
    churn crossed it and registrations were coalesced (test_drain_unit counted 28 writers of 32
    in a loaded run). The budget's own tests pass registration_budget_ms themselves
    (test_registration_churn.py); companion processes keep the default."""
    from ros_side import companion
    monkeypatch.setattr(companion, "REGISTRATION_BUDGET_MS", 10 ** 6)


@pytest.fixture
def sink():
    return RecordingSink()


@pytest.fixture(scope="session")
def test_domain():
    return TEST_DOMAIN


@pytest.fixture(scope="module")
def dp():
    """An independent participant (plain cyclonedds, hand-written IDL types)."""
    from cyclonedds.domain import DomainParticipant
    p = DomainParticipant(TEST_DOMAIN)
    yield p
    p.__del__()


@pytest.fixture(scope="module")
def dds_backend():
    from ros_side.backends.dds import DdsBackend
    b = DdsBackend(domain=TEST_DOMAIN, distro="humble")
    yield b
    b.close()
