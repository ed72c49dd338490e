"""The clinic environment (MedExAgent reproduced): a simulated patient to question, an exam catalogue with costs,
and a diagnosis as the final answer, under deterministic patient and exam noise."""

from case_env.envs.clinic.environment import ClinicEnvironment

__all__ = ["ClinicEnvironment"]
