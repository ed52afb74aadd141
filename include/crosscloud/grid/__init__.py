"""Answering the grid: demand response and compute that follows prices inside a run."""
