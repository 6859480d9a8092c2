"""Side-by-side benchmarks: every figure is a ratio of two commands measured alternately in one run."""
