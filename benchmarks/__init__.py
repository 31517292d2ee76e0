"""Benchmarks of the engines (speed, accuracy, memory, transport, PSI) and a retrain soak test."""
