"""Benchmarks of the harness (run as modules, e.g. ``python -m benchmarks.wire``).

Speed is measured here, never in the unit tests: the tests only check that each benchmark
runs and produces figures.
"""
