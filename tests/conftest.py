"""Shared fixtures: one real embedded stack per test session, fresh names per test.

In CI (``CI=true``) a service that cannot start fails the session; it is never skipped.
The fixtures of one area (a flaky webhook, a running gateway, the command replies of a
simulated home) live beside that area's helpers in ``tests/support`` and are registered
here, so the unit, integration and end-to-end tests of the area all reach them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iotwatch.application.stack import EmbeddedStack, StackState
from iotwatch.settings import Settings, load_settings

REPO_ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = [
    "tests.support.alerts",
    "tests.support.gateway",
    "tests.support.homes",
    "tests.support.paging_schemas",
]


#: Test folders whose files run one after another on one pytest-xdist worker: each
#: end-to-end file runs a whole pipeline of its own (servers, Spark, simulators), and two at
#: once on a 2-core machine starve each other into start-up and settle timeouts.
ONE_WORKER_FOLDERS = ("tests/e2e/",)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Each test file is one unit of work for a worker (``--dist=loadfile``: its module
    fixtures start once), except that the files of :data:`ONE_WORKER_FOLDERS` are one unit
    together, so the other worker runs the rest meanwhile."""
    from xdist.scheduler import LoadScopeScheduling

    class FileOrFolderScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return next((folder for folder in ONE_WORKER_FOLDERS if path.startswith(folder)), path)

    return FileOrFolderScheduling(config, log)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """After a run that checked the types (``tests/unit/repo/test_types.py``), how many lines
    of product code silence mypy (each with its error code and reason, or that test fails)."""
    if not any(
        getattr(report, "nodeid", "").startswith("tests/unit/repo/test_types.py")
        for reports in terminalreporter.stats.values()
        for report in reports
    ):
        return
    from tests.support.type_check import silencers

    explained, unexplained = silencers()
    terminalreporter.write_sep("-", "type check")
    terminalreporter.write_line(
        f"type: ignore in product code: {len(explained)}, each with an error code and a reason"
        + (f"; {len(unexplained)} other silencer(s), which fail the type test" if unexplained else "")
    )


@pytest.fixture(scope="session")
def base_settings() -> Settings:
    """Settings from defaults only: the developer's IOTWATCH_* variables do not leak in."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("IOTWATCH_")}
    try:
        return load_settings()
    finally:
        os.environ.update(saved)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, base_settings: Settings) -> Iterator[StackState]:
    """The embedded stack (mosquitto or amqtt, Apache Kafka, influxd), started once per session."""
    embedded = EmbeddedStack(base_settings, tmp_path_factory.mktemp("stack"))
    state = embedded.up()
    try:
        yield state
    finally:
        embedded.down()


@pytest.fixture(scope="session")
def stack_settings(stack: StackState, base_settings: Settings) -> Settings:
    """Settings pointing at the session's embedded stack."""
    return stack.apply_to(base_settings)


@pytest.fixture
def unique() -> str:
    """A short unique suffix for topic, group and device names of one test."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
def test_settings(stack_settings: Settings, unique: str) -> Settings:
    """Stack settings with this test's own Kafka topics, so tests never see each other's data."""
    topics = stack_settings.topics.model_copy(
        update={
            "raw": f"test.{unique}.raw",
            "dlq": f"test.{unique}.dlq",
            "alerts": f"test.{unique}.alerts",
            "model_updates": f"test.{unique}.model",
            "alert_state": f"test.{unique}.alerts.state",
            "silences": f"test.{unique}.alerts.silences",
            "notifications": f"test.{unique}.alerts.notifications",
            "commands": f"test.{unique}.commands",
            "device_twin": f"test.{unique}.devices.twin",
            "emergencies": f"test.{unique}.emergencies",
        }
    )
    return stack_settings.model_copy(update={"topics": topics})


@pytest.fixture(scope="session")
def spark(base_settings: Settings) -> Iterator[object]:
    """One local Spark session for every Spark test (start-up costs 10-20 s), configured
    as the streaming job configures it."""
    from iotwatch.jvm.spark import end_jvm
    from iotwatch.streaming.job import spark_session

    session = spark_session(base_settings.stream.model_copy(update={"spark_master": "local[2]"}), "iotwatch-tests")
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
        end_jvm()  # or the JVM outlives the test process, heap and all


@pytest.fixture(scope="session")
def nab_dir() -> Path:
    """The labelled NAB streams shipped in the repository (nothing outside it is needed)."""
    from iotwatch.evaluation.sources import NAB_SAMPLE

    return NAB_SAMPLE
