"""Benchmarks of the imaging environment: data layer, server under load, UK Biobank ingest."""
