"""``python -m iotwatch`` is the ``iotwatch`` command."""

from iotwatch.cli import main

main()
