"""Benchmarks: run on demand, print their figures (never part of the tests)."""
