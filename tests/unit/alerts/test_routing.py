"""The policy tree of the routing file, and the shipped example files (no servers needed)."""

from __future__ import annotations

import pytest

from iotwatch.alerts.routing import RoutingError, load_routing, parse_routing
from iotwatch.contract.alerts import AlertRecord
from iotwatch.responder.policy import DEFAULT_POLICIES, load_policies
from tests.conftest import REPO_ROOT
from tests.support.alerts import make_alert

DEPLOY = REPO_ROOT / "deploy" / "oncall"


def alert(**fields: str) -> AlertRecord:
    """A raised alert, by default a major stuck_hvac on a thermostat at home-1."""
    wanted = {"site": "home-1", "device_type": "thermostat", "rule": "stuck_hvac", "severity": "major", **fields}
    return make_alert("d", wanted["device_type"], wanted["site"], wanted["rule"], wanted["severity"], "raised", 0)


def test_first_match_continue_nesting_and_inheritance() -> None:
    tree = load_routing(DEPLOY / "routes.toml")
    # a home alert: the homes channel (first match, no continue), grouped as the root says
    (route,) = tree.routes(alert())
    assert (route.receiver, route.group_by, route.group_wait_s, route.repeat_interval_s) == (
        "homes-slack",
        ("site", "rule"),
        30.0,
        4 * 3600.0,
    )
    assert route.group_key(alert()) == "0.1:{site=home-1,rule=stuck_hvac}"
    # critical: the pager (its own grouping and timing) and, continuing, the homes channel
    routes = tree.routes(alert(device_type="leak_sensor", rule="water_leak", severity="critical"))
    assert [(r.receiver, r.group_by, r.repeat_interval_s) for r in routes] == [
        ("pager", ("device_id",), 900.0),
        ("homes-slack", ("site", "rule"), 4 * 3600.0),
    ]
    # a nested policy takes the detector's warnings back to on-call
    (route,) = tree.routes(alert(rule="anomaly_score", severity="warning"))
    assert (route.receiver, route.path) == ("oncall", "0.1.0")
    # nothing matches: the root's receiver
    (route,) = tree.routes(alert(device_type="vehicle_edr", rule="harsh_braking", severity="warning"))
    assert (route.receiver, route.path) == ("oncall", "0")


def test_the_shipped_policy_file_is_the_built_in_policy() -> None:
    shipped = load_policies(DEPLOY / "policy.toml")
    assert [(p.name, p.rule, p.command) for p in shipped] == [(p.name, p.rule, p.command) for p in DEFAULT_POLICIES]
    assert all(p.ttl == 120.0 for p in shipped if p.action == "command")


def test_routing_file_errors_name_the_problem() -> None:
    with pytest.raises(RoutingError, match="not defined: nowhere"):
        parse_routing(
            {
                "receivers": {"a": {"url": "http://x/"}},
                "route": {"receiver": "a", "routes": [{"match": {"site": "s"}, "receiver": "nowhere"}]},
            }
        )
    with pytest.raises(RoutingError, match="unknown alert field"):
        parse_routing({"receivers": {"a": {"url": "http://x/"}}, "route": {"receiver": "a", "group_by": ["colour"]}})
    with pytest.raises(RoutingError, match="not a duration"):
        parse_routing({"receivers": {"a": {"url": "http://x/"}}, "route": {"receiver": "a", "group_wait": "soon"}})
    with pytest.raises(RoutingError, match="a, b all take records"):
        parse_routing(
            {
                "receivers": {name: {"url": "http://x/", "format": "record"} for name in ("a", "b")},
                "route": {"receiver": "a"},
            }
        )
