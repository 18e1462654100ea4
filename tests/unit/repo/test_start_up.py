"""The edge components start light: the gateway, the simulators and the on-call tools do not
import the analytics stack (pandas, PySpark). Each is started many times over (one process
per gateway instance, per simulator worker, per restart after a fault), and pandas alone adds
seconds of start-up and tens of megabytes to every one of them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Modules each edge component's process imports to do its work.
EDGE_MODULES = ("gateway.bridge", "gateway.supervisor", "devices.simulation", "responder.service", "alerts.dispatch")
HEAVY = ("pandas", "pyspark")

_PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps([name for name in sys.argv[2:] if name in sys.modules]))
"""


@pytest.mark.parametrize("module", EDGE_MODULES)
def test_an_edge_component_does_not_import_the_analytics_stack(module: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, module, *HEAVY], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(result.stdout) == [], f"{module} imports {result.stdout.strip()}"
