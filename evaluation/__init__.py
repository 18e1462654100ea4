"""Measuring detectors: sources, NAB scoring, the evaluation over labelled streams
(``labelled_streams``) and over a simulated fleet through the job's own logic (``simulated``)."""
