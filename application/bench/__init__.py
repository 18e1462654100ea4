"""``iotwatch bench``: each stage measured against its raw path in the same run.

The benchmarks sit above the stages they measure (they start brokers, stages and their raw
counterparts); nothing in a stage imports them. ``record.py`` keeps a result as a file under
``results/`` and ``render.py`` makes the documents' tables from those files.
"""
