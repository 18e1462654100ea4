"""Provisioning of a deployment's credentials: MQTT device accounts and ACLs, TLS
certificates. Files are written for docker-compose (deploy/mosquitto) to mount; secrets go
to files only (mode 0600), never to stdout or logs."""
