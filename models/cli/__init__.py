"""The detectors' command: ``iotwatch train`` (registered in :data:`iotwatch.app.SUBCOMMANDS`)."""
