import re

import numpy as np
import pandas as pd

from iotwatch.contract.measurements import DEVICE_METRICS
from iotwatch.streaming.sinks.influx_points import aggregate_lines


def _parsed(line: str) -> tuple[str, dict[str, float | str], str]:
    """Series, fields (floats as numbers: ``21`` and ``21.0`` are one float), time."""
    series, fields, time = re.split(r"(?<!\\) ", line)
    values = dict(field.split("=", 1) for field in re.split(r"(?<!\\),", fields))
    return series, {k: v if v.endswith("i") else float(v) for k, v in values.items()}, time


def test_aggregates_are_written_as_the_contract_s_points_would_be_a_nan_field_left_out() -> None:
    aggregates = pd.DataFrame(
        {
            "device_id": ["home-1-thermostat-0", "odd id,with=marks"],
            "device_type": "thermostat",
            "site": "home-1",
            "metric": ["temperature_c", "humidity_pct"],
            "event_ms": np.array([1_763_784_000_000, 1_763_784_060_000], dtype=np.int64),
            "count": np.array([60, 3], dtype=np.int64),
            "sum": [1260.0, 120.0],
            "min": [20.5, 39.0],
            "max": [21.4, 41.0],
            "last": [21.1, 40.0],
            "max_score": [0.25, np.nan],
            "mean": [21.0, 40.0],
        }
    )
    expected = [
        DEVICE_METRICS.point(
            {name: row[name] for name in ("site", "device_type", "device_id", "metric")},
            {
                **{name: row[name] for name in ("mean", "min", "max", "last") if not np.isnan(row[name])},
                **({} if np.isnan(row["max_score"]) else {"max_score": row["max_score"]}),
                "count": int(row["count"]),
            },
            int(row["event_ms"]),
        ).to_line_protocol()
        for row in aggregates.to_dict("records")
    ]
    assert [_parsed(line) for line in aggregate_lines(aggregates)] == [_parsed(line) for line in expected]
    assert "max_score" not in expected[1] and "odd\\ id\\,with\\=marks" in expected[1]
    assert aggregate_lines(aggregates.iloc[:0]) == []
