"""casfs benchmarks: casfs against the alternatives, side by side, as ratios (``bench/run``)."""
