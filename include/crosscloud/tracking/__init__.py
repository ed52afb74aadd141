"""What a person sees of runs: MLflow runs and registry, plots, the run report and live progress."""
