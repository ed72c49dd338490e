"""Deterministic synthetic longitudinal Dixon MRI patients."""
