"""pytest set-up for tests/e2e: loopback-only DDS with a domain id of this run (helpers.py, imported
before any DDS participant exists), one independent DDS participant, the bridges, UBRB clients."""

from __future__ import annotations

from typing import Any, Callable, Iterator, List

import pytest

from tests.e2e.helpers import E2E_DOMAIN, E2E_XML, MODES, Client, Dds, open_bridge


@pytest.fixture(scope="session")
def dp() -> Iterator[Any]:
    """An independent DDS participant (plain cyclonedds, hand-written IDL types), loopback only,
    in this run's domain id and discovery tag."""
    from cyclonedds.domain import Domain, DomainParticipant
    domain = Domain(E2E_DOMAIN, config=E2E_XML)
    p = DomainParticipant(E2E_DOMAIN)
    yield p
    p.__del__()
    domain.__del__()


@pytest.fixture(scope="session")
def dcps(dp: Any) -> Any:
    """Builtin readers of the independent participant: (DCPSPublication, DCPSSubscription)."""
    from cyclonedds.builtin import (BuiltinDataReader, BuiltinTopicDcpsPublication,
                                    BuiltinTopicDcpsSubscription)
    return (BuiltinDataReader(dp, BuiltinTopicDcpsPublication),
            BuiltinDataReader(dp, BuiltinTopicDcpsSubscription))


@pytest.fixture
def dds(dp: Any) -> Iterator[Dds]:
    """Readers and writers of the independent participant, deleted when the test ends."""
    d = Dds(dp)
    yield d
    d.close()


@pytest.fixture(scope="module", params=MODES)
def bridge(request: Any) -> Iterator[Any]:
    """One bridge per transport per module: udp link, serial link (pty pairs), direct mode."""
    yield from open_bridge(request.param)


@pytest.fixture
def connect() -> Iterator[Callable[..., Client]]:
    """``connect(bridge, name)``: a UBRB client (HELLO done), closed when the test ends."""
    made: List[Client] = []

    def make(b: Any, name: str = "e2e") -> Client:
        c = Client(b.port, name)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()
