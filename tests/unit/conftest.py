"""Unit tests run pure logic: the fixtures that start servers fail here instead.

A test that needs the embedded stack (mosquitto, Apache Kafka, InfluxDB) or Spark belongs in
``tests/integration`` (one component) or ``tests/e2e`` (several processes); these overrides
make one placed here fail with that hint, whichever fixture brought the server in.
"""

from __future__ import annotations

import pytest


def _misplaced(server: str) -> None:
    pytest.fail(f"a unit test starts no server ({server}): move it to tests/integration or tests/e2e", pytrace=False)


@pytest.fixture(scope="session")
def stack() -> None:
    """Refused: the embedded stack."""
    _misplaced("the embedded stack")


@pytest.fixture(scope="session")
def spark() -> None:
    """Refused: a Spark session."""
    _misplaced("Spark")
