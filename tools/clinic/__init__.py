"""The clinic environment's tools: ask the simulated patient, order an examination."""
