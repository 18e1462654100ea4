"""Measuring detectors on labelled streams: sources, NAB scoring and the evaluation runner."""
