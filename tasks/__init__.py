"""Thin Prefect tasks around fedcore, one concern each (see flows/ for how they are chained).

Tasks that touch raw data run with `persist_result=False` and no caching (DATA_LOCAL), so nothing of an
institution's data is ever written to Prefect's result storage.
"""
