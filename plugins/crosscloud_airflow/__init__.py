"""Airflow integration of crosscloud: operators per access method and the coordinator.

Everything here is thin: it turns Airflow context (params, run id, logs, kill
signals) into calls of the engine in ``crosscloud``.
"""
