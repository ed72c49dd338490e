"""case-env's environments as a verifiers taskset (`vf-eval case-env-verifiers`)."""

from case_env_verifiers.taskset import CaseTaskset

__all__ = ["CaseTaskset"]
