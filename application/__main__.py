"""``python -m iotwatch.application`` is the ``iotwatch`` command."""

from iotwatch.application.cli import main

main()
