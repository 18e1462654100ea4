"""The closed loop: ``iotwatch respond`` turns alerts into corrective device commands per a
policy file, follows the devices' replies and keeps the audit trail on the commands topic;
``iotwatch devices show|set`` reads and changes device twins through the same commands
(:mod:`iotwatch.responder.twin_ops`)."""
