"""Benchmarks run by `case-env bench`."""
