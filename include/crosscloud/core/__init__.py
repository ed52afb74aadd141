"""Names, paths, the job spec, model presets and the federation: what every other part speaks."""
