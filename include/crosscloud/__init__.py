"""crosscloud: one training job over several sovereign clouds.

The engine: importable without Airflow, so the same code runs in an Airflow
worker, in a remote cloud's pod and in tests.
"""

__version__ = "0.1.0"
