"""Patient data layer: discovery, NIfTI loading, caching, volumetry, validation."""
