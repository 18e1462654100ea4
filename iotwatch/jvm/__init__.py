"""Spark and the Java it runs on: the local session's launcher, Spark's home and jars, the
patches the pinned release needs, and the driver's class-data archive."""
