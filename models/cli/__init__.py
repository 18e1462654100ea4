"""Command-line commands of the detectors package (registered in iotwatch.cli.SUBCOMMANDS)."""
