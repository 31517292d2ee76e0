"""Moving messages between master and parties: in process, or over Arrow Flight with mutual TLS."""
