"""The run harness: what every scenario that runs the whole pipeline (``iotwatch demo``,
``iotwatch chaos``, the benches) does the same way.

- :mod:`.pipeline`: the components' command lines and environment, waiting for the job's
  first micro-batch, and when a drained pipeline has caught up;
- :mod:`.probe`: the stage counters, once a second (gateways, raw topics, the job's checkpoint, alerts);
- :mod:`.accounting`: where every reading went, by device and seq (loss);
- :mod:`.receiver`: the local webhook the forwarder notifies;
- :mod:`.results`: the typed results' JSON, the summary and its ``summary.json``.

A scenario starts what it needs over these and adds its own: the demo its live view, sites and
judgement against the ground truth; chaos its fault schedule and proofs.
"""
