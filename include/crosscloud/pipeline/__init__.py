"""The stages of a cross-cloud training run, and retraining, as plain functions the DAGs call."""
