"""Privacy techniques: ID hashing and PSI, label encryption, differential privacy, secure aggregation."""
