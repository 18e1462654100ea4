"""iotwatch: IoT telemetry ingestion and anomaly detection (shared contracts, settings, CLI)."""
