"""The imaging environment's tools: visits, organ volumetry, slices and comparisons, reports, context."""
