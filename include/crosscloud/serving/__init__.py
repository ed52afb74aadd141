"""Serving a model on several clouds: energy and price per token, traffic placement by price and grid requests, the offline replay."""
