"""The aggregates' line protocol, built by Arrow, against a real InfluxDB: what is read back
is what the frame holds (escaped tags, floats exact, a NaN field absent, the count an integer)."""

import time

import numpy as np
import pandas as pd

from iotwatch.clients.influx import InfluxV1Client
from iotwatch.settings import Settings
from iotwatch.streaming.sinks.influx_points import aggregate_lines


def test_aggregate_lines_read_back_from_influxdb_as_written(stack_settings: Settings, unique: str) -> None:
    now_ms = int(time.time() * 1000) // 60_000 * 60_000
    ids = [f"plain-{unique}", f"odd {unique},with=marks", f"third-{unique}"]
    aggregates = pd.DataFrame(
        {
            "device_id": ids,
            "device_type": ["thermostat", "leak sensor", "vehicle_edr"],
            "site": "home-1",
            "metric": ["temperature_c", "humidity_pct", "speed,kmh"],
            "event_ms": np.array([now_ms - 120_000, now_ms - 60_000, now_ms], dtype=np.int64),
            "count": np.array([60, 3, 2**40], dtype=np.int64),
            "sum": [1260.0, 120.0, 1.0],
            "min": [20.0, -0.0, 5e-324],
            "max": [21.4, 1e20, 1.7976931348623157e308],
            "last": [21.1, 1e-7, 0.1 + 0.2],
            "max_score": [0.25, np.nan, np.nan],
            "mean": [21.0, 40.0, 123456789.123456789],
        }
    )
    client = InfluxV1Client(stack_settings.influx)
    client.write_lines(aggregate_lines(aggregates))
    fields = "mean, min, max, last, max_score, count"
    for row in aggregates.to_dict("records"):
        series = client.query(
            f"SELECT {fields}, device_type, metric FROM device_metrics WHERE device_id = '{row['device_id']}'"
        )
        assert series, row["device_id"]
        (values,) = series[0]["values"]
        assert values[0] == row["event_ms"]
        score = None if np.isnan(row["max_score"]) else row["max_score"]
        expected = [row["mean"], row["min"], row["max"], row["last"], score, row["count"]]
        assert values[1:7] == expected and type(values[6]) is int
        assert values[7:] == [row["device_type"], row["metric"]]
    keys = client.query("SHOW FIELD KEYS FROM device_metrics")
    assert dict(keys[0]["values"])["count"] == "integer"
    client.close()
