"""One run's records: its plan, its round history and its single-cluster baseline."""
