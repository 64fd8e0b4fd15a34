"""pytest set-up for tests/ros: loopback-only DDS and a per-run domain id (see ros_helpers.py,
imported here before any DDS participant exists), plus the shared fixtures."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from ros_helpers import TEST_DOMAIN, RecordingSink  # noqa: E402


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
