"""Cheap surprises per reading, each judged by the likelihood of its own recent history,
and one alarm per episode."""

from __future__ import annotations

from typing import Any, ClassVar

from iotwatch.contract.detection import AnomalyKind
from iotwatch.models.kernels import Kernel, KernelDetector
from iotwatch.models.kernels import episode_likelihood as kernel

__all__ = ["EpisodeLikelihood"]


class EpisodeLikelihood(KernelDetector):
    """The per-(device, metric) detector of the streaming job and ``score-csv``'s default,
    with one set of defaults for both (``StreamSettings.device_detector_params`` is empty).

    Each reading gives five raw *surprises*:

    - *level*: ``log1p`` of the z against a slow exponential baseline (shifts), whose
      half-life is ``level_halflife_s`` of event time (two days: whole daily cycles) over the
      stream's mean reading interval, between ``min_level_halflife`` and ``level_halflife``
      readings (a week of a series read every 5 minutes);
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
      between or beyond the usual modes), judged only on a stream whose steps beyond 3
      deviations are at least 1.5 times ``trend_clip_rate`` of them (above): on a sensor
      moving smoothly, a level its first days barely visited is reached
      gradually and is the weather over days, the first weekday after a weekend or an
      operator's new setpoint (the level, step and trend views judge an abrupt move there),
      while on counts and loads, whose steps are bursts, a rare level is the evidence.

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
      common), so a lone spike alarms on its own reading; on a light-tailed stream never
      rarer than a Gaussian tail of the step (there the fitted index learns the light tail
      within days, and the discount alone put a noise step of 4 deviations at the fire level);
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
    the range is set and are judged once they have learned as many readings as the range
    took (a whole cycle: judged sooner, every hour of the day they have not yet seen is
    rare) and at least ``histogram_warmup``, unless ``distribution_views`` is off. The
    smallest tail of all views, in decades ``d``, scores ``d / (d + 10)``.

    Benchmarks and operators alike want one alarm per episode: a reading scores only when
    its score exceeds the *held* peak of earlier scores, which decays with half-life
    ``hold_halflife`` readings; otherwise it scores 0. Whatever the threshold, an episode
    crosses it once. No score for the first ``warmup`` readings.

    The arithmetic is one compiled kernel (:mod:`iotwatch.models.kernels.episode_likelihood`,
    which has the layout of the state: 52 numbers); this class holds one stream's row and
    calls the kernel's step on a batch of one reading.

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
    _kernel: ClassVar[Kernel[Any]] = kernel
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
        level_halflife: float = 6000.0,
        level_halflife_s: float = 180_000.0,
        min_level_halflife: float = 2000.0,
        step_halflife: float = 2000.0,
        likelihood_halflife: float = 10_000.0,
        short_alpha: float = 0.15,
        min_variance: float = 0.05,
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
        self.level_halflife_s = level_halflife_s
        self.min_level_halflife = min_level_halflife
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
        self._start()
