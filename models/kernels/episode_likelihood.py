"""The arithmetic of :class:`iotwatch.models.episode_likelihood.EpisodeLikelihood`: one float64 row per stream.

The streaming job scores every reading of every ``(device, metric)`` stream with this
detector: this kernel runs its step over a whole micro-batch of interleaved streams in one
numba call; the class runs the same step on a batch of one reading.

State layout
------------
A row has :data:`STATE_SIZE` (52) numbers; the counter is a float (exact below 2**53),
``last = None`` is NaN and the empty range is ``(+inf, -inf)``:

=====================  ==========================================================
``N``                  readings learned
``MEAN``, ``VAR``      the slow level baseline
``STEP_VAR``           the variance of steps between readings
``LAST``               the previous reading (NaN: none yet)
``LOW``, ``HIGH``      the histograms' range (set over the first ``range_readings``
                       readings and ``range_s`` of event time)
``T0``                 the first reading's event time (ms; NaN: none yet)
``RANGE_N``            readings learned when the range closed (0: still open)
``A_HISTOGRAM``,       the slow and fast histograms' per-reading weights (set from the
``A_RECENT``           event-time half-lives when the range closes)
``HELD``               the held peak score (one alarm per episode)
``VIEW + 3 j + k``     view ``j`` (level, step, trend, recent distribution, rarity): ``k`` = 0
                       short average, 1 its long-run mean, 2 its long-run variance
``SLOW + b``           the slow histogram's share of bin ``b``
``RECENT + b``         the fast histogram's
``STEP_TAIL + k``      the step's Pareto tail (:func:`~.primitives.tail_learn`, as
                       :class:`~iotwatch.models.exceedance.ExceedanceTail`): its state but
                       the count (``TAIL_RATE`` .. ``TAIL_CLUSTER_PEAK`` of
                       :mod:`.primitives`, less one)
``STUCK + k``          the run of identical readings (:func:`~.primitives.repeat_learn`,
                       as :class:`~iotwatch.models.repeat_run.RepeatRun`): ``RATE``,
                       ``RUN``, ``REVERSALS``, ``DIRECTION``
=====================  ==========================================================

Two counts and a value are not stored because the row holds them already: the tail
learns every reading from the warm-up on (its count is ``max(N - warmup, 0)``), the run
detector every reading but the first (``max(N - 1, 0)``) and its last value is ``LAST``.
That keeps a device of four metrics under 2 KB in the job's state store.

Parameters are a float64 vector (:func:`params_vector`, offsets ``P_*``), read from a
detector so any constructor arguments carry over.

Cost
----
``iotwatch bench stream`` times 200,000 readings of 1,000
interleaved streams (random order) after warm-up on one core, through one batch call and
through the class's ``score_learn_one`` (a batch of one reading a call), and prints both
per reading. The kernel works on a row of floats a stream, so its cost per reading is
arithmetic, not Python objects.

Examples
--------
>>> from iotwatch.models.episode_likelihood import EpisodeLikelihood
>>> params = params_vector(EpisodeLikelihood())
>>> states = np.tile(initial_state(params), (2, 1))
>>> rng = np.random.default_rng(1)
>>> stream = np.arange(4000, dtype=np.int64) % 2
>>> values = np.round(20.0 + rng.normal(0.0, 0.1, 4000), 2)
>>> values[-1] = 25.0
>>> t_ms = 1_700_000_000_000 + np.arange(4000, dtype=np.int64) // 2 * 60_000
>>> scores = score_learn(states, stream, values, t_ms, params)
>>> round(float(scores[:-1].max()), 2), round(float(scores[-1]), 2), int(states[1, N])
(0.39, 0.73, 2000)
>>> one = EpisodeLikelihood()
>>> alone = [one.score_learn_one({"m": v}, t) for v, t in zip(values[1::2].tolist(), t_ms[1::2].tolist())]
>>> row = np.array([float(v) for v in one.to_state()["row"]])
>>> bool(np.array_equal(scores[1::2], alone)), bool(np.array_equal(row, states[1], equal_nan=True))
(True, True)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from iotwatch.models.exceedance import ExceedanceTail
from iotwatch.models.kernels.primitives import (
    TAIL_PARAMS,
    TAIL_SIZE,
    Floats,
    check_batch,
    decay_weight,
    jit,
    put_initial_tail,
    put_state,
    put_tail_params,
    py_max,
    py_min,
    reading_value,
    repeat_learn,
    repeat_tail,
    tail_learn,
    tail_params,
    tail_tail,
    upper_tail,
)
from iotwatch.models.repeat_run import RepeatRun

if TYPE_CHECKING:
    from iotwatch.models.episode_likelihood import EpisodeLikelihood

__all__ = [
    "A_HISTOGRAM",
    "A_RECENT",
    "HELD",
    "HIGH",
    "LAST",
    "LOW",
    "MEAN",
    "N",
    "PARAMS_SIZE",
    "RANGE_N",
    "RECENT",
    "SLOW",
    "STATE_SIZE",
    "STEP_TAIL",
    "STEP_VAR",
    "STUCK",
    "T0",
    "VAR",
    "VIEW",
    "initial_state",
    "params_vector",
    "score_learn",
    "score_learn_into",
]

#: Histogram bins: ``BINS - 2`` inner bins over the early range (widened by ``margin``
#: each side) and one open bin below and one above it.
BINS = 8
#: Smoothed views: level, step, recent distribution (relative entropy), value rarity.
VIEWS = 5
#: The step view's position in ``views``; its lower tail is the *quiet* view.
_STEP = 1
#: Views from this position on read the histograms: judged once the range is set.
_HISTOGRAM_VIEWS = 3
#: The trend view's position: the short average of signed steps (a drift moves one way).
_TREND = 2
#: The rarity view's position: judged on streams whose steps are not light-tailed (:func:`_score`).
_RARITY = 4
#: The rarity view is judged where :func:`_light` is at most this: big steps at least 1.5
#: times ``trend_clip_rate`` of them.
_RARITY_LIGHT = 0.5
#: The instant view's Gaussian floor holds once the step tail's Pareto index has learned a
#: tail lighter than this (its prior is 0.25): :func:`_with_instant`.
_LIGHT_INDEX = 0.2
#: Smallest probability a histogram bin is credited with (keeps logarithms finite).
_FLOOR = 1e-4
#: Runs of identical readings in the bins up to this one (below and at the bottom of the
#: early range) are not judged: a count at zero, a meter at its idle load repeat by nature.
_FLOOR_BINS = 1
#: Decades of tail probability that score 0.5.
_HALF_DECADES = 10.0

# --- state layout ------------------------------------------------------------------------------

N, MEAN, VAR, STEP_VAR, LAST, LOW, HIGH, HELD, T0, RANGE_N, A_HISTOGRAM, A_RECENT = range(12)
VIEW = 12
SLOW = VIEW + 3 * VIEWS
RECENT = SLOW + BINS
STEP_TAIL = RECENT + BINS
STUCK = STEP_TAIL + TAIL_SIZE - 1
STUCK_RATE, STUCK_RUN, STUCK_REVERSALS, STUCK_DIRECTION = STUCK, STUCK + 1, STUCK + 2, STUCK + 3
STATE_SIZE = STUCK + 4

# --- parameter layout --------------------------------------------------------------------------

(
    P_WARMUP,
    P_RANGE,
    P_HISTOGRAM_WARMUP,
    P_DISTRIBUTION_VIEWS,
    P_A_LEVEL,
    P_A_STEP,
    P_A_LIKELIHOOD,
    P_SHORT_ALPHA,
    P_MIN_VARIANCE,
    P_HOLD,
    P_CLIP,
    P_A_HISTOGRAM,
    P_A_RECENT,
    P_MARGIN,
    P_INSTANT_WEIGHT,
    P_RANGE_MS,
    P_HISTOGRAM_HALFLIFE_S,
    P_RECENT_HALFLIFE_S,
    P_HISTOGRAM_WEIGHT,
    P_TREND_ALPHA,
    P_TREND_WEIGHT,
    P_TREND_CLIP,
    P_TREND_CLIP_RATE,
    P_LIGHT_TREND_WEIGHT,
    P_TREND_HALFLIFE_S,
    P_LEVEL_HALFLIFE_S,
    P_LEVEL_HALFLIFE,
    P_MIN_LEVEL_HALFLIFE,
    P_A_LEVEL_MAX,
) = range(29)
P_STEP_TAIL = 29
#: The run detector's: tolerance, weight, prior readings, max repeat rate, min reversals, prior rate.
P_STUCK = P_STEP_TAIL + TAIL_PARAMS
PARAMS_SIZE = P_STUCK + 6

_jit = jit
#: The empty ``surprise`` of :func:`score_learn` (no surprises kept).
_NO_SURPRISE = np.empty(0)


# --- parameters and a fresh row ----------------------------------------------------------------


def params_vector(detector: EpisodeLikelihood) -> np.ndarray:
    """Every number the step needs, from a detector's parameters (its half-lives as
    per-reading weights; the step's tail and run detector with their own defaults)."""
    p = np.empty(PARAMS_SIZE)
    p[:P_STEP_TAIL] = (
        detector.warmup,
        detector.range_readings,
        detector.histogram_warmup,
        1.0 if detector.distribution_views else 0.0,
        decay_weight(detector.level_halflife),
        decay_weight(detector.step_halflife),
        decay_weight(detector.likelihood_halflife),
        detector.short_alpha,
        detector.min_variance,
        1.0 - decay_weight(detector.hold_halflife),
        detector.clip,
        decay_weight(detector.histogram_halflife),
        decay_weight(detector.recent_halflife),
        detector.margin,
        detector.instant_weight,
        1000.0 * detector.range_s,
        detector.histogram_halflife_s,
        detector.recent_halflife_s,
        detector.histogram_weight,
        detector.trend_alpha,
        detector.trend_weight,
        detector.trend_clip,
        detector.trend_clip_rate,
        detector.light_trend_weight,
        detector.trend_halflife_s,
        detector.level_halflife_s,
        detector.level_halflife,
        detector.min_level_halflife,
        decay_weight(detector.min_level_halflife),
    )
    put_tail_params(p, P_STEP_TAIL, ExceedanceTail())
    stuck = RepeatRun(max_repeat_rate=detector.max_repeat_rate)
    p[P_STUCK:] = (
        stuck.tolerance,
        stuck._a,
        stuck.prior_readings,
        stuck.max_repeat_rate,
        stuck.min_reversals,
        stuck.prior_rate,
    )
    return p


def initial_state(params: np.ndarray) -> np.ndarray:
    """A fresh stream's row: nothing learned, the tail's and the run detector's priors."""
    row = np.zeros(STATE_SIZE)
    row[LAST], row[LOW], row[HIGH], row[T0] = math.nan, math.inf, -math.inf, math.nan
    row[A_HISTOGRAM], row[A_RECENT] = params[P_A_HISTOGRAM], params[P_A_RECENT]
    row[SLOW : SLOW + BINS] = row[RECENT : RECENT + BINS] = 1.0 / BINS
    tail = np.zeros(TAIL_SIZE)
    put_initial_tail(tail, 0, params, P_STEP_TAIL)
    row[STEP_TAIL:STUCK] = tail[1:]
    row[STUCK_RATE] = params[P_STUCK + 5]
    return row


# --- the step ------------------------------------------------------------------------------------


@_jit
def _bin(low: float, high: float, margin: float, v: float) -> int:
    """The histogram bin of ``v``: ``BINS - 2`` inner bins over the range widened by
    ``margin`` each side, one open bin below it and one above (0 while no range is set)."""
    if not high > low:
        return 0
    span = high - low
    position = (v - (low - margin * span)) / (span * (1.0 + 2.0 * margin)) * (BINS - 2)
    if position < 0.0:
        return 0
    if position >= BINS - 2:
        return BINS - 1
    return 1 + int(position)


@_jit
def _scales(row: np.ndarray) -> tuple[float, float]:
    """Level and step deviations, floored at 0.1 % of the level (a constant stream)."""
    floor = 1e-3 * abs(row[MEAN])
    floor = floor * floor + 1e-12
    return math.sqrt(py_max(row[VAR], floor)), math.sqrt(py_max(row[STEP_VAR], floor))


@_jit
def _step_tail(row: np.ndarray, warmup: float) -> tuple[float, float, float, float, float, float]:
    """The step tail's state tuple, its count derived from ``N``."""
    return (
        py_max(row[N] - warmup, 0.0),
        row[STEP_TAIL],
        row[STEP_TAIL + 1],
        row[STEP_TAIL + 2],
        row[STEP_TAIL + 3],
        row[STEP_TAIL + 4],
    )


@_jit
def _stuck(row: np.ndarray) -> tuple[float, float, float, float, float, float]:
    """The run detector's state tuple, its count and last value derived from ``N`` and ``LAST``."""
    return (
        py_max(row[N] - 1.0, 0.0),
        row[STUCK_RATE],
        row[LAST],
        row[STUCK_RUN],
        row[STUCK_REVERSALS],
        row[STUCK_DIRECTION],
    )


@_jit
def _light(row: np.ndarray, p: np.ndarray) -> float:
    """1 on a stream whose steps beyond 3 deviations are at most ``trend_clip_rate`` of them
    (about a Gaussian's rate: a big step there is rare), 0 from twice that rate on
    (heavy-tailed steps: a count stream's bursts, an appliance switching), linear between."""
    if p[P_TREND_CLIP_RATE] <= 0.0:
        return 1.0
    return py_min(py_max(2.0 - row[STEP_TAIL] / p[P_TREND_CLIP_RATE], 0.0), 1.0)


@_jit
def _trend_clip(row: np.ndarray, p: np.ndarray) -> float:
    """How many step deviations one step may add to the trend: ``clip``, up to
    ``trend_clip`` on a light-tailed stream (:func:`_light`), where a drift's steps are big."""
    clip: float = p[P_CLIP] + (p[P_TREND_CLIP] - p[P_CLIP]) * _light(row, p)
    return clip


@_jit
def _trend_tail_weight(row: np.ndarray, p: np.ndarray) -> float:
    """How many times more common the trend's tail counts: ``trend_weight``, and
    ``light_trend_weight`` on a light-tailed stream (geometric between)."""
    weight: float = p[P_TREND_WEIGHT]
    if p[P_LIGHT_TREND_WEIGHT] == weight:
        return weight
    return math.exp(
        math.log(p[P_TREND_WEIGHT]) + (math.log(p[P_LIGHT_TREND_WEIGHT]) - math.log(p[P_TREND_WEIGHT])) * _light(row, p)
    )


@_jit
def _histograms_learned(row: np.ndarray, p: np.ndarray) -> bool:
    """Whether the histogram views are judged: once the range is set, the histograms must
    learn for as many readings as the range took (a day at least: a daily cycle seen whole)
    and ``histogram_warmup`` readings. Judged after fewer, the slow histogram and the
    views' own likelihoods know the hours since the range closed, not the day: each part
    of the cycle it has not yet visited is rare, and a new sensor false-alarms through its
    second day."""
    closed = row[RANGE_N]
    learned: bool = closed != 0.0 and row[N] >= closed + py_max(closed, p[P_HISTOGRAM_WARMUP])
    return learned


@_jit
def _with_instant(tail: float, row: np.ndarray, p: np.ndarray, step: float, tail_p: Floats) -> float:
    """``tail``, or the instant step view's if smaller: the step's Pareto tail counted
    ``1 / instant_weight`` times rarer, and on a light-tailed stream (:func:`_light`) never
    rarer than a Gaussian's two-sided tail of the step. The discount assumes the Pareto fit
    errs on the side of common, as it does under its priors; on a sensor's Gaussian noise
    its index learns the light tail within days, and the discounted tail alone puts a step
    of about 4 deviations of noise at the fire level from the third day on
    (``tests/unit/models/test_instant_step.py``). The floor waits for that: while the index
    is at or above ``_LIGHT_INDEX`` (its prior, or a tail of real bursts) the discount is
    not yet wrong, and a stream read every 5 minutes whose big steps are near a Gaussian's
    share keeps the view (NAB's ``speed_6005``: its only detection)."""
    pareto: float = p[P_INSTANT_WEIGHT] * tail_tail(_step_tail(row, p[P_WARMUP]), tail_p, step)
    if pareto >= tail:
        return tail
    light = _light(row, p) if row[STEP_TAIL + 2] < _LIGHT_INDEX else 0.0
    return pareto if light <= 0.0 else py_min(tail, py_max(pareto, light * 2.0 * upper_tail(step)))


@_jit
def _score(
    row: np.ndarray,
    p: np.ndarray,
    v: float,
    shorts: tuple[float, float, float, float, float],
    step: float,
    trend_alpha: float,
    tail_p: Floats,
    stuck_p: Floats,
) -> float:
    """The smallest tail of the views on the log scale, ``d / (d + 10)`` of its decades ``d``
    (before the one-per-episode hold)."""
    judged = VIEWS if p[P_DISTRIBUTION_VIEWS] != 0.0 and _histograms_learned(row, p) else _HISTOGRAM_VIEWS
    tail = 1.0
    trend_weight = _trend_tail_weight(row, p)
    trend_floor = p[P_MIN_VARIANCE] * (trend_alpha / p[P_TREND_ALPHA]) ** 2
    # On a light-tailed stream (a sensor moving smoothly) a level the first days barely visited
    # is reached gradually and is the weather over days, the first weekday after a weekend or an
    # operator's setpoint: its rarity is not judged (the level, step and trend views judge an
    # abrupt move there). On counts and loads, whose steps are bursts, a rare level is the evidence.
    # A sensor's rate of big steps wanders about a Gaussian's share (a room's temperature between
    # 0.2 % and 0.5 % of its steps over its first days): judged from just above that share, rarity
    # would be judged on about half the sensors and page at the first weekday's new levels.
    rarity = _light(row, p) <= _RARITY_LIGHT
    for j in range(judged):
        if j == _RARITY and not rarity:
            continue
        z = (shorts[j] - row[VIEW + 3 * j + 1]) / math.sqrt(
            py_max(row[VIEW + 3 * j + 2], trend_floor if j == _TREND else p[P_MIN_VARIANCE])
        )
        weight = p[P_HISTOGRAM_WEIGHT] if j >= _HISTOGRAM_VIEWS else trend_weight if j == _TREND else 1.0
        tail = py_min(tail, upper_tail(z) * weight)
        if j == _STEP:
            tail = py_min(tail, upper_tail(-z))
        elif j == _TREND:
            tail = py_min(tail, upper_tail(-z) * weight)
    tail = _with_instant(tail, row, p, step, tail_p)
    if row[RANGE_N] == 0.0 or _bin(row[LOW], row[HIGH], p[P_MARGIN], v) > _FLOOR_BINS:
        tail = py_min(tail, repeat_tail(_stuck(row), stuck_p, v))
    decades = -math.log10(py_max(tail, 1e-300))
    return decades / (decades + _HALF_DECADES)


@_jit
def _set_histogram_rates(row: np.ndarray, p: np.ndarray, interval_s: float) -> None:
    """Half-lives in event time, so a stream read every 30 s and one read every 5 min
    compare the same hours of their lives (the range period gives the interval)."""
    if interval_s > 0.0:
        if p[P_HISTOGRAM_HALFLIFE_S] > 0.0:
            row[A_HISTOGRAM] = decay_weight(p[P_HISTOGRAM_HALFLIFE_S] / interval_s)
        if p[P_RECENT_HALFLIFE_S] > 0.0:
            row[A_RECENT] = decay_weight(p[P_RECENT_HALFLIFE_S] / interval_s)


@_jit
def _trend_weight(row: np.ndarray, p: np.ndarray, t: float) -> float:
    """The trend's per-reading weight: a half-life of ``trend_halflife_s`` of event time
    over the stream's mean reading interval so far, never more than ``trend_alpha``."""
    if p[P_TREND_HALFLIFE_S] > 0.0 and not math.isnan(row[T0]) and row[N] > 0.0 and t > row[T0]:
        return py_min(p[P_TREND_ALPHA], decay_weight(p[P_TREND_HALFLIFE_S] * row[N] / ((t - row[T0]) / 1000.0)))
    alpha: float = p[P_TREND_ALPHA]
    return alpha


@_jit
def _level_weight(row: np.ndarray, p: np.ndarray, t: float) -> float:
    """The level baseline's per-reading weight: a half-life of ``level_halflife_s`` of event
    time over the stream's mean reading interval so far (whole daily cycles), between
    ``min_level_halflife`` and ``level_halflife`` readings. A sensor read every 30 s or
    faster remembers 6,000 readings (two days at 30 s); a series read every 5 minutes
    2,000 (a week), not three weeks of its past levels."""
    alpha: float = p[P_A_LEVEL]
    if p[P_LEVEL_HALFLIFE_S] <= 0.0 or math.isnan(row[T0]) or not t > row[T0]:
        return alpha
    halflife = p[P_LEVEL_HALFLIFE_S] * row[N] / ((t - row[T0]) / 1000.0)
    if halflife >= p[P_LEVEL_HALFLIFE]:
        return alpha
    if halflife <= p[P_MIN_LEVEL_HALFLIFE]:
        alpha = p[P_A_LEVEL_MAX]
        return alpha
    return decay_weight(halflife)


@_jit
def _score_learn_one(
    row: np.ndarray, x: float, t: float, p: np.ndarray, tail_p: Floats, stuck_p: Floats
) -> tuple[float, float]:
    """Score, then learn, one reading of one stream's row: its score (0 unless above the
    held peak) and its surprise (the score before the hold)."""
    v = reading_value(x)
    if math.isnan(v):
        return 0.0, 0.0
    warmup = p[P_WARMUP]
    b = _bin(row[LOW], row[HIGH], p[P_MARGIN], v)
    sd, step_sd = _scales(row)
    level = abs(v - row[MEAN]) / sd
    step = abs(v - row[LAST]) / step_sd if not math.isnan(row[LAST]) else 0.0
    trend_clip = _trend_clip(row, p)
    signed = py_max(-trend_clip, py_min(trend_clip, (v - row[LAST]) / step_sd)) if not math.isnan(row[LAST]) else 0.0
    a_recent = row[A_RECENT]
    entropy = 0.0
    for k in range(BINS):
        f = row[RECENT + k] * (1.0 - a_recent) + (a_recent if k == b else 0.0)
        entropy += f * math.log((f + _FLOOR) / (row[SLOW + k] + _FLOOR))
    rarity = -math.log(row[SLOW + b] + _FLOOR)
    alpha = p[P_SHORT_ALPHA]
    trend_alpha = _trend_weight(row, p, t)
    shorts = (
        row[VIEW] + alpha * (math.log1p(level) - row[VIEW]),
        row[VIEW + 3] + alpha * (math.log1p(step) - row[VIEW + 3]),
        row[VIEW + 6] + trend_alpha * (signed - row[VIEW + 6]),
        row[VIEW + 9] + alpha * (entropy - row[VIEW + 9]),
        row[VIEW + 12] + alpha * (rarity - row[VIEW + 12]),
    )
    n = row[N]
    out = score = 0.0
    if n >= warmup:
        score = _score(row, p, v, shorts, step, trend_alpha, tail_p, stuck_p)
        if score > row[HELD]:
            out = score
        row[HELD] = py_max(row[HELD] * p[P_HOLD], score)
        put_state(row, STEP_TAIL, tail_learn(_step_tail(row, warmup), tail_p, step)[1:])
    _, rate, _, run, reversals, direction = repeat_learn(_stuck(row), stuck_p, v)
    row[STUCK_RATE], row[STUCK_RUN], row[STUCK_REVERSALS], row[STUCK_DIRECTION] = rate, run, reversals, direction
    # learn: the level and step baselines
    n += 1.0
    row[N] = n
    clip = p[P_CLIP]
    a = 1.0 / n
    if a < p[P_A_LEVEL_MAX]:  # past the running mean's phase
        a = py_max(a, _level_weight(row, p, t))
    r = v - row[MEAN]
    if n > warmup:
        r = py_max(-clip * sd, py_min(clip * sd, r))
    row[MEAN] += a * r
    row[VAR] += a * (r * r - row[VAR])
    if not math.isnan(row[LAST]):
        d = v - row[LAST]
        if n > warmup:
            d = py_max(-clip * step_sd, py_min(clip * step_sd, d))
        row[STEP_VAR] += py_max(1.0 / n, p[P_A_STEP]) * (d * d - row[STEP_VAR])
    row[LAST] = v
    # the histograms
    if math.isnan(row[T0]):
        row[T0] = t
    if row[RANGE_N] == 0.0:
        row[LOW], row[HIGH] = py_min(row[LOW], v), py_max(row[HIGH], v)
        if n >= p[P_RANGE] and t - row[T0] >= p[P_RANGE_MS]:
            row[RANGE_N] = n
            _set_histogram_rates(row, p, (t - row[T0]) / 1000.0 / py_max(n - 1.0, 1.0))
    else:
        a = py_max(1.0 / (n - row[RANGE_N]), row[A_HISTOGRAM])
        for k in range(BINS):
            s = row[SLOW + k]
            row[SLOW + k] = s + a * ((1.0 if k == b else 0.0) - s)
    a_recent = row[A_RECENT]  # the range may have closed just now
    for k in range(BINS):
        row[RECENT + k] = row[RECENT + k] * (1.0 - a_recent) + (a_recent if k == b else 0.0)
    # the views' likelihoods (the histogram views' once the range is set)
    for j in range(VIEWS):
        learned = n if j < _HISTOGRAM_VIEWS else (n - row[RANGE_N] if row[RANGE_N] != 0.0 else 0.0)
        row[VIEW + 3 * j] = shorts[j]
        if learned > 0:
            a = py_max(1.0 / learned, p[P_A_LIKELIHOOD])
            delta = shorts[j] - row[VIEW + 3 * j + 1]
            row[VIEW + 3 * j + 1] += a * delta
            row[VIEW + 3 * j + 2] += a * (delta * delta - row[VIEW + 3 * j + 2])
    return out, score


@_jit
def score_learn_into(
    states: np.ndarray,
    stream: np.ndarray,
    values: np.ndarray,
    t_ms: np.ndarray,
    params: np.ndarray,
    surprise: np.ndarray,
) -> np.ndarray:
    """Score, then learn, each reading in order against its stream's row of ``states``
    (updated in place), as :class:`~iotwatch.models.episode_likelihood.EpisodeLikelihood` scores them;
    each reading's ``surprise_one`` goes to ``surprise`` when it has the batch's length
    (pass an empty array to skip it).

    One call takes a whole micro-batch, many streams interleaved; each stream's readings
    must be in order among themselves. ``states`` is ``(n_streams, STATE_SIZE)`` float64,
    ``stream`` int64 row indices, ``values`` float64, ``t_ms`` int64 event times (they
    close the histograms' range), ``params`` from :func:`params_vector`. A non-finite
    value scores 0 and is not learned. Raises on mismatched shapes or a stream index out
    of range, before learning anything.
    """
    n = check_batch(states, stream, values, t_ms, params, STATE_SIZE, PARAMS_SIZE)
    tail_p = tail_params(params, P_STEP_TAIL)
    stuck_p = (params[P_STUCK], params[P_STUCK + 1], params[P_STUCK + 2], params[P_STUCK + 3], params[P_STUCK + 4])
    keep = surprise.shape[0] == n
    out = np.empty(n)
    for i in range(n):
        out[i], raw = _score_learn_one(states[stream[i]], values[i], float(t_ms[i]), params, tail_p, stuck_p)
        if keep:
            surprise[i] = raw
    return out


def score_learn(
    states: np.ndarray, stream: np.ndarray, values: np.ndarray, t_ms: np.ndarray, params: np.ndarray
) -> np.ndarray:
    """:func:`score_learn_into` without the surprises: the scores alone."""
    return score_learn_into(states, stream, values, t_ms, params, _NO_SURPRISE)
