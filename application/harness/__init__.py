"""The run harness: what every scenario that runs the whole pipeline (``iotwatch demo``, ``iotwatch
chaos``, the benches) does the same way (docs/internals.md, "Run harness")."""
