"""Benchmarks and one-question probes, run from a checkout (they are not part
of the wheel): ``python -m benchmarks.bench gpu docs/benchmarks.md``."""
