"""The evaluation's commands: ``iotwatch evaluate`` and ``iotwatch score-csv`` (registered in
:data:`iotwatch.app.SUBCOMMANDS`)."""
