"""`make bench`: baseline vs single techniques vs search; results in ``results/`` and BENCHMARKS.md."""
