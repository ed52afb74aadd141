"""Methods only the benchmarks use: price-aware timing, the cluster simulator and job traces."""
