"""Smoke tests of the benchmarks (they check that figures are produced, never speed)."""
