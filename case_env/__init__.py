"""case-env: an RL environment server for clinical agents that gather evidence with tools."""

__version__ = "0.1.0"
