"""``iotwatch demo``: the whole pipeline on the embedded stack, with a live view and a report."""
