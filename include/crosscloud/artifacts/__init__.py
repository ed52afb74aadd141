"""Models, data and images where they are needed: preheat, the warm set each cloud keeps, and the catalog."""
