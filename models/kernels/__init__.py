"""Compiled twins of the per-reading detectors, for the streaming hot path.

The detectors in :mod:`models` are the readable reference: one Python object per
``(device, metric)`` stream, its state a nested JSON-able dict, about 18 us a reading. A
kernel does the same arithmetic in numba-compiled code over a whole micro-batch at once,
with every stream's state one row of a float64 array: no Python object per reading, so a
reading costs a few hundred nanoseconds or less.

Each kernel names its reference detector (``models/kernels/<name>.py`` mirrors
``models/<name>.py`` function by function, so the two read side by side), converts state
to and from the reference exactly, and ``tests/models/test_kernels.py`` checks that the
two give the same scores and the same final state. Change the reference first, then its
kernel, and let that test say whether they still agree.
"""
