"""Drifts are judged on an event-time scale: the trend view of ``episode_likelihood`` averages
over ``trend_halflife_s`` of event time, so a sensor read every second sees a ramp within
about the same seconds as one read every 30 s."""

from __future__ import annotations

import numpy as np
import pytest

from iotwatch.models.episode_likelihood import EpisodeLikelihood
from iotwatch.models.kernels import episode_likelihood as kernel

START_MS = 1_763_784_000_000
FIRE = 0.40  # the streaming job's alert_fire_score


def _stream(interval_s: float, slope_per_s: float, seed: int = 3) -> tuple[np.ndarray, np.ndarray, int]:
    """Two days of a noisy daily wave read every ``interval_s``, then a ramp of
    ``slope_per_s`` for 15 minutes: (values, event times, index of the ramp's first reading)."""
    rng = np.random.default_rng(seed)
    before = int(2 * 86_400 / interval_s)
    n = before + int(900 / interval_s)
    elapsed = np.arange(n) * interval_s
    values = np.round(20.0 + 2.0 * np.sin(2 * np.pi * elapsed / 86_400) + rng.normal(0.0, 0.1, n), 2)
    values[before:] += slope_per_s * (elapsed[before:] - elapsed[before])
    return values, START_MS + (elapsed * 1000).astype(np.int64), before


def _delay_s(params: dict[str, float], interval_s: float, slope_per_s: float) -> tuple[float | None, int]:
    """Seconds of event time from the ramp's start to the first score at the fire level,
    and the readings of the last day before it that scored there."""
    values, t_ms, start = _stream(interval_s, slope_per_s)
    p = kernel.params_vector(EpisodeLikelihood(**params))
    states = kernel.initial_state(p)[None, :].copy()
    scores = kernel.score_learn(states, np.zeros(len(values), dtype=np.int64), values, t_ms, p)
    hits = np.flatnonzero(scores[start:] >= FIRE)
    quiet = int((scores[start // 2 : start] >= FIRE).sum())
    return (float(hits[0] * interval_s) if len(hits) else None), quiet


@pytest.mark.parametrize("interval_s", [1.0, 5.0])
def test_a_ramp_is_caught_within_a_minute_whatever_the_reading_rate(interval_s: float) -> None:
    # 0.01 C/s: 0.6 C a minute on a sensor whose readings scatter by 0.1 C
    delay, _ = _delay_s({}, interval_s, 0.01)
    counted_in_readings, _ = _delay_s({"trend_halflife_s": 0.0}, interval_s, 0.01)
    assert delay is not None and delay <= 90.0
    # averaged over a reading count instead, the same ramp waits longer
    assert counted_in_readings is None or counted_in_readings > delay


def test_the_time_scale_adds_no_false_alarm_on_the_quiet_day() -> None:
    for interval_s in (1.0, 5.0):
        _, quiet = _delay_s({}, interval_s, 0.01)
        _, quiet_by_readings = _delay_s({"trend_halflife_s": 0.0}, interval_s, 0.01)
        assert quiet <= quiet_by_readings


def test_light_tailed_streams_let_a_step_count_more_toward_the_trend() -> None:
    detector = EpisodeLikelihood()
    p = kernel.params_vector(detector)
    row = kernel.initial_state(p)
    row[kernel.STEP_TAIL] = 0.002  # the step tail's rate: rarer than a Gaussian's 0.27 % beyond 3 deviations
    assert kernel._trend_clip(row, p) == detector.trend_clip
    row[kernel.STEP_TAIL] = 0.02  # a count stream's bursts
    assert kernel._trend_clip(row, p) == detector.clip
    assert kernel._trend_tail_weight(row, p) == pytest.approx(detector.trend_weight)
