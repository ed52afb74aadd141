"""Models, data and images where they are needed: preheat, distribution plans and the catalog."""
