"""Electricity prices and carbon, their forecast, the power model and metered power."""
