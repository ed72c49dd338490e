"""case-env tests."""
