"""``python -m iotwatch`` is the ``iotwatch`` command."""

from iotwatch.app import main

main()
