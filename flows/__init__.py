"""Prefect flows: the master's retrain pipeline, batch prediction, and each institution's agent."""
