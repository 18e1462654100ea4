"""Cheap surprises per reading, each judged by the likelihood of its own recent history,
and one alarm per episode."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Self

from iotwatch.contract.detection import AnomalyKind
from iotwatch.models.base import Detector, Reading, UnivariateMixin
from iotwatch.models.exceedance import ExceedanceTail
from iotwatch.models.numeric import decay_weight, upper_tail
from iotwatch.models.repeat_run import RepeatRun

__all__ = ["BINS", "VIEWS", "EpisodeLikelihood"]

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
#: Smallest probability a histogram bin is credited with (keeps logarithms finite).
_FLOOR = 1e-4
#: Runs of identical readings in the bins up to this one (below and at the bottom of the
#: early range) are not judged: a count at zero, a meter at its idle load repeat by nature.
_FLOOR_BINS = 1
#: Decades of tail probability that score 0.5.
_HALF_DECADES = 10.0


class EpisodeLikelihood(UnivariateMixin, Detector):
    """The per-(device, metric) detector of the streaming job and ``score-csv``'s default,
    with one set of defaults for both (``StreamSettings.device_detector_params`` is empty).

    Each reading gives five raw *surprises*:

    - *level*: ``log1p`` of the z against a slow exponential baseline (shifts);
    - *step*: ``log1p`` of the jump from the previous reading in step deviations (spikes,
      the onset of a shift, noise bursts);
    - *trend*: the signed step in step deviations, averaged over ``trend_halflife_s`` of
      event time (over the stream's mean reading interval so far; never with more weight
      than ``trend_alpha`` a reading) and judged both ways: noise reverses direction, a
      drift keeps going one way, so a ramp shows here before its level stands out of a
      daily swing -- within the same seconds on a sensor read every second as on one read
      every 30 s (an average over more readings varies less, so its variance floor shrinks
      with its weight). A step adds at most ``clip`` deviations to it, and up to
      ``trend_clip`` on a light-tailed stream: one whose steps beyond 3 deviations are at
      most ``trend_clip_rate`` of them, about a Gaussian's share (none from twice that
      share on); there a big step is rare and a drift's steps are big, while on a count
      stream's bursts or a meter's appliances a big step is common;
    - *recent distribution*: the relative entropy of a fast histogram of the last hours
      against a slow one (a change of shape within the usual range: a flat stretch in a
      daily wave, a missing peak);
    - *rarity*: ``-log`` of the slow histogram's share of the reading's bin (values
      between or beyond the usual modes).

    As in HTM's anomaly likelihood, a surprise is not thresholded raw: its short
    exponential average (weight ``short_alpha``) is compared with the long-run mean and
    variance of that average on this stream (a Gaussian upper tail), so a noisy stream
    must surprise more than a quiet one; the variance is floored at ``min_variance`` so
    that a stream whose surprises are nearly constant (a perfect square wave) is not
    startled by its own regular jumps. The trend's tail counts ``trend_weight`` times
    (``light_trend_weight`` on a light-tailed stream, geometrically between) and
    the histogram views' ``histogram_weight`` times more common than it is (their
    Gaussian fit is the roughest: on sensors they would otherwise add false alarms).
    Three more views judge at once what averaging would blur:

    - *quiet*: the step view's lower tail (a stream that moves much less than it did);
    - *instant step*: the step's Pareto tail (:class:`iotwatch.models.exceedance.ExceedanceTail`),
      counted ``1 / instant_weight`` times rarer (a Pareto tail errs on the side of
      common), so a lone spike alarms on its own reading;
    - *stuck*: a run of identical readings (:class:`iotwatch.models.repeat_run.RepeatRun`), judged
      only on streams that repeat a reading at most ``max_repeat_rate`` of the time and,
      once the range is set, not at its floor (a count at zero, an idle load).

    Parameters are set per stream from its early, probationary part: the histograms'
    range is that of its first ``range_readings`` readings and at least ``range_s`` of
    event time (a day: a daily cycle seen whole), and the mean reading interval over that
    period turns the histograms' half-lives in event time (``histogram_halflife_s``,
    ``recent_halflife_s``) into per-reading weights, so a sensor read every 30 s and a
    series sampled every 5 min compare the same hours of their lives. Past ``warmup`` the
    baselines learn an outlier clipped to ``clip`` deviations (learning a young stream's
    early spike whole would numb its step view for a day). The histogram views learn once
    the range is set and are judged ``histogram_warmup`` readings later, unless
    ``distribution_views`` is off. The smallest tail of all views, in decades ``d``, scores
    ``d / (d + 10)``.

    Benchmarks and operators alike want one alarm per episode: a reading scores only when
    its score exceeds the *held* peak of earlier scores, which decays with half-life
    ``hold_halflife`` readings; otherwise it scores 0. Whatever the threshold, an episode
    crosses it once. The state is 52 numbers (:mod:`iotwatch.models.kernels.episode_likelihood`
    has the layout and the compiled twin); no score for the first ``warmup`` readings.

    Examples
    --------
    >>> import math, random
    >>> rng = random.Random(1)
    >>> det = EpisodeLikelihood()
    >>> t = lambda i: 1_700_000_000_000 + i * 60_000
    >>> signal = lambda i: round(20 + 2 * math.sin(2 * math.pi * i / 1440) + rng.gauss(0, 0.1), 2)
    >>> quiet = max(det.score_learn_one({"t": signal(i)}, t(i)) for i in range(3000))
    >>> spike = [det.score_learn_one({"t": 25.0}, t(3000 + i)) for i in range(3)]
    >>> round(quiet, 2), round(spike[0], 2), spike[1:]  # the spike alarms once, then holds
    (0.38, 0.68, [0.0, 0.0])
    """

    name: ClassVar[str] = "episode_likelihood"
    detects: ClassVar[frozenset[AnomalyKind]] = frozenset(
        {AnomalyKind.SPIKE, AnomalyKind.LEVEL_SHIFT, AnomalyKind.NOISE_BURST, AnomalyKind.FLATLINE}
    )

    def __init__(
        self,
        metric: str | None = None,
        warmup: int = 60,
        range_readings: int = 150,
        range_s: float = 86_400.0,
        histogram_warmup: int = 150,
        distribution_views: bool = True,
        level_halflife: float = 2000.0,
        step_halflife: float = 2000.0,
        likelihood_halflife: float = 10_000.0,
        short_alpha: float = 0.15,
        min_variance: float = 0.03,
        hold_halflife: float = 300.0,
        clip: float = 3.0,
        histogram_halflife: float = 1000.0,
        recent_halflife: float = 20.0,
        margin: float = 0.1,
        instant_weight: float = 1e-3,
        max_repeat_rate: float = 0.2,
        histogram_halflife_s: float = 300_000.0,
        recent_halflife_s: float = 6_000.0,
        histogram_weight: float = 1000.0,
        trend_alpha: float = 0.3,
        trend_weight: float = 1e6,
        trend_halflife_s: float = 60.0,
        trend_clip: float = 8.0,
        trend_clip_rate: float = 0.0035,
        light_trend_weight: float | None = 100.0,
    ) -> None:
        self.metric = metric
        self.warmup = warmup
        self.range_readings = range_readings
        self.range_s = range_s
        self.histogram_warmup = histogram_warmup
        self.distribution_views = distribution_views
        self.level_halflife = level_halflife
        self.step_halflife = step_halflife
        self.likelihood_halflife = likelihood_halflife
        self.short_alpha = short_alpha
        self.min_variance = min_variance
        self.hold_halflife = hold_halflife
        self.clip = clip
        self.histogram_halflife = histogram_halflife
        self.recent_halflife = recent_halflife
        self.margin = margin
        self.instant_weight = instant_weight
        self.max_repeat_rate = max_repeat_rate
        self.histogram_halflife_s = histogram_halflife_s
        self.recent_halflife_s = recent_halflife_s
        self.histogram_weight = histogram_weight
        self.trend_alpha = trend_alpha
        self.trend_weight = trend_weight
        self.trend_clip = trend_clip
        self.trend_clip_rate = trend_clip_rate
        self.light_trend_weight = trend_weight if light_trend_weight is None else light_trend_weight
        self.trend_halflife_s = trend_halflife_s
        #: Each view's tail counted this many times more common (errs towards fewer alarms).
        self._weights = (1.0, 1.0, trend_weight) + (histogram_weight,) * (VIEWS - _HISTOGRAM_VIEWS)
        self._a_level = decay_weight(level_halflife)
        self._a_step = decay_weight(step_halflife)
        self._a_likelihood = decay_weight(likelihood_halflife)
        self._hold = 1.0 - decay_weight(hold_halflife)
        self._a_histogram = decay_weight(histogram_halflife)
        self._a_recent = decay_weight(recent_halflife)
        self.n = 0
        self.mean = self.var = self.step_var = 0.0
        self.last: float | None = None
        self.low, self.high = math.inf, -math.inf
        #: Event time of the first reading (ms; None: none yet) and the readings learned when
        #: the range closed (0: still open).
        self.t0: float | None = None
        self.range_n = 0
        #: The histograms' per-reading weights: from the half-lives in readings, or, once the
        #: range closes, from those in event time over the stream's mean reading interval.
        self.a_histogram, self.a_recent = self._a_histogram, self._a_recent
        self.held = 0.0
        #: Per view: short average of the surprise, long-run mean and variance of that average.
        self.views = [[0.0, 0.0, 0.0] for _ in range(VIEWS)]
        self.slow = [1.0 / BINS] * BINS
        self.recent = [1.0 / BINS] * BINS
        self.step_tail = ExceedanceTail()
        self.stuck = RepeatRun(max_repeat_rate=max_repeat_rate)

    # --- the views ----------------------------------------------------------------------

    def _scales(self) -> tuple[float, float]:
        """Level and step deviations, floored at 0.1 % of the level (a constant stream)."""
        floor = 1e-3 * abs(self.mean)
        floor = floor * floor + 1e-12
        return math.sqrt(max(self.var, floor)), math.sqrt(max(self.step_var, floor))

    def _bin(self, v: float) -> int:
        if not self.high > self.low:
            return 0
        span = self.high - self.low
        position = (v - (self.low - self.margin * span)) / (span * (1.0 + 2.0 * self.margin)) * (BINS - 2)
        if position < 0.0:
            return 0
        if position >= BINS - 2:
            return BINS - 1
        return 1 + int(position)

    def _recent_after(self, b: int) -> list[float]:
        return [f * (1.0 - self.a_recent) + (self.a_recent if k == b else 0.0) for k, f in enumerate(self.recent)]

    def _deviations(self, v: float) -> tuple[float, float]:
        """|level z| and |step z| of ``v``."""
        sd, step_sd = self._scales()
        return abs(v - self.mean) / sd, abs(v - self.last) / step_sd if self.last is not None else 0.0

    def _trend_weight(self, t_ms: float) -> float:
        """The trend's per-reading weight: a half-life of ``trend_halflife_s`` of event time
        over the stream's mean reading interval so far, never more than ``trend_alpha``."""
        if self.trend_halflife_s > 0.0 and self.t0 is not None and self.n > 0 and t_ms > self.t0:
            return min(self.trend_alpha, decay_weight(self.trend_halflife_s * self.n / ((t_ms - self.t0) / 1000.0)))
        return self.trend_alpha

    def _light(self) -> float:
        """1 on a stream whose steps beyond 3 deviations are at most ``trend_clip_rate`` of them
        (about a Gaussian's rate: a big step there is rare), 0 from twice that rate on
        (heavy-tailed steps: a count stream's bursts, an appliance switching), linear between."""
        if self.trend_clip_rate <= 0.0:
            return 1.0
        return min(max(2.0 - self.step_tail._rate / self.trend_clip_rate, 0.0), 1.0)

    def _trend_clip(self) -> float:
        """How many step deviations one step may add to the trend: ``clip``, up to
        ``trend_clip`` on a light-tailed stream (:meth:`_light`), where a drift's steps are big."""
        return self.clip + (self.trend_clip - self.clip) * self._light()

    def _trend_tail_weight(self) -> float:
        """How many times more common the trend's tail counts: ``trend_weight``, and
        ``light_trend_weight`` on a light-tailed stream (geometric between)."""
        if self.light_trend_weight == self.trend_weight:
            return self.trend_weight
        return math.exp(
            math.log(self.trend_weight)
            + (math.log(self.light_trend_weight) - math.log(self.trend_weight)) * self._light()
        )

    def _shorts(self, v: float, b: int, t_ms: float) -> list[float]:
        """Each view's short average once ``v`` (in bin ``b``, at event time ``t_ms``) is counted."""
        level, step = self._deviations(v)
        entropy = sum(
            f * math.log((f + _FLOOR) / (s + _FLOOR)) for f, s in zip(self._recent_after(b), self.slow, strict=True)
        )
        rarity = -math.log(self.slow[b] + _FLOOR)
        _, step_sd = self._scales()
        trend_clip = self._trend_clip()
        signed = max(-trend_clip, min(trend_clip, (v - self.last) / step_sd)) if self.last is not None else 0.0
        surprises = (math.log1p(level), math.log1p(step), signed, entropy, rarity)
        trend_alpha = self._trend_weight(t_ms)
        return [
            view[0] + (trend_alpha if j == _TREND else self.short_alpha) * (r - view[0])
            for j, (view, r) in enumerate(zip(self.views, surprises, strict=True))
        ]

    def _score(self, v: float, t_ms: int, shorts: list[float]) -> float:
        """The smallest tail on the log scale (before the one-per-episode hold)."""
        judged = (
            VIEWS
            if self.distribution_views and self.range_n and self.n >= self.range_n + self.histogram_warmup
            else _HISTOGRAM_VIEWS
        )
        tail = 1.0
        # an average over more readings varies less: the trend's floor shrinks with its weight
        trend_floor = self.min_variance * (self._trend_weight(t_ms) / self.trend_alpha) ** 2
        for j in range(judged):
            short, mean, var = shorts[j], self.views[j][1], self.views[j][2]
            z = (short - mean) / math.sqrt(max(var, trend_floor if j == _TREND else self.min_variance))
            weight = self._trend_tail_weight() if j == _TREND else self._weights[j]
            tail = min(tail, upper_tail(z) * weight)
            if j == _STEP:
                tail = min(tail, upper_tail(-z))
            elif j == _TREND:
                tail = min(tail, upper_tail(-z) * weight)
        tail = min(tail, self.instant_weight * self.step_tail.tail(self._deviations(v)[1]))
        if (
            not self.range_n or self._bin(v) > _FLOOR_BINS
        ):  # a run at the floor (zero counts, an idle load) is not a stuck sensor
            tail = min(tail, self.stuck.tail({"value": v}, t_ms))
        decades = -math.log10(max(tail, 1e-300))
        return decades / (decades + _HALF_DECADES)

    # --- the protocol -------------------------------------------------------------------

    def score_one(self, x: Reading, t_ms: int) -> float:
        v = self._value(x)
        if v is None or self.n < self.warmup:
            return 0.0
        score = self._score(v, t_ms, self._shorts(v, self._bin(v), t_ms))
        return score if score > self.held else 0.0

    def surprise_one(self, x: Reading, t_ms: int) -> float:
        v = self._value(x)
        if v is None or self.n < self.warmup:
            return 0.0
        return self._score(v, t_ms, self._shorts(v, self._bin(v), t_ms))

    def learn_one(self, x: Reading, t_ms: int) -> None:
        v = self._value(x)
        if v is None:
            return
        b = self._bin(v)
        shorts = self._shorts(v, b, t_ms)
        if self.n >= self.warmup:
            self.held = max(self.held * self._hold, self._score(v, t_ms, shorts))
            self.step_tail.learn(self._deviations(v)[1])
        self.stuck.learn_one({"value": v}, t_ms)
        sd, step_sd = self._scales()
        self.n += 1
        n = self.n
        a = max(1.0 / n, self._a_level)
        r = v - self.mean
        if n > self.warmup:  # past warm-up an outlier moves the baseline by clip deviations at most
            r = max(-self.clip * sd, min(self.clip * sd, r))
        self.mean += a * r
        self.var += a * (r * r - self.var)
        if self.last is not None:
            step = v - self.last
            if n > self.warmup:
                step = max(-self.clip * step_sd, min(self.clip * step_sd, step))
            self.step_var += max(1.0 / n, self._a_step) * (step * step - self.step_var)
        self.last = v
        if self.t0 is None:
            self.t0 = float(t_ms)
        if not self.range_n:
            self.low, self.high = min(self.low, v), max(self.high, v)
            if n >= self.range_readings and t_ms - self.t0 >= 1000.0 * self.range_s:
                self.range_n = n
                self._set_histogram_rates((t_ms - self.t0) / 1000.0 / max(n - 1, 1))
        else:
            a = max(1.0 / (n - self.range_n), self.a_histogram)
            self.slow = [s + a * ((1.0 if k == b else 0.0) - s) for k, s in enumerate(self.slow)]
        self.recent = self._recent_after(b)
        for j, (view, short) in enumerate(zip(self.views, shorts, strict=True)):
            # the histogram views learn their likelihood once the range is set
            learned = n if j < _HISTOGRAM_VIEWS else (n - self.range_n if self.range_n else 0)
            view[0] = short
            if learned > 0:
                a = max(1.0 / learned, self._a_likelihood)
                delta = short - view[1]
                view[1] += a * delta
                view[2] += a * (delta * delta - view[2])

    def _set_histogram_rates(self, interval_s: float) -> None:
        """Half-lives in event time, so a stream read every 30 s and one read every 5 min
        compare the same hours of their lives (the range period gives the interval)."""
        if interval_s > 0.0:
            if self.histogram_halflife_s > 0.0:
                self.a_histogram = decay_weight(self.histogram_halflife_s / interval_s)
            if self.recent_halflife_s > 0.0:
                self.a_recent = decay_weight(self.recent_halflife_s / interval_s)

    # --- state --------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "mean": self.mean,
            "var": self.var,
            "step_var": self.step_var,
            "last": self.last,
            "low": self.low,
            "high": self.high,
            "t0": self.t0,
            "range_n": self.range_n,
            "a_histogram": self.a_histogram,
            "a_recent": self.a_recent,
            "held": self.held,
            "views": [list(v) for v in self.views],
            "slow": list(self.slow),
            "recent": list(self.recent),
            "step_tail": self.step_tail.to_state(),
            "stuck": self.stuck.to_state(),
        }

    def set_state(self, state: Mapping[str, Any]) -> Self:
        self.n = int(state["n"])
        self.mean, self.var, self.step_var = float(state["mean"]), float(state["var"]), float(state["step_var"])
        self.last = None if state["last"] is None else float(state["last"])
        self.low, self.high, self.held = float(state["low"]), float(state["high"]), float(state["held"])
        self.t0 = None if state.get("t0") is None else float(state["t0"])
        self.range_n = int(state.get("range_n", 0))
        self.a_histogram = float(state.get("a_histogram", self._a_histogram))
        self.a_recent = float(state.get("a_recent", self._a_recent))
        self.views = [[float(x) for x in v] for v in state["views"]]
        self.slow = [float(x) for x in state["slow"]]
        self.recent = [float(x) for x in state["recent"]]
        self.step_tail.set_state(state["step_tail"])
        self.stuck.set_state(state["stuck"])
        return self
