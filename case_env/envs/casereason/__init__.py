"""The case-reasoning environment (MedCaseReasoning reproduced): a long case presentation, reasoning in <think>, a
judged diagnosis in <answer>, k attempts, and recall of the clinician's reasoning statements."""

from case_env.envs.casereason.environment import CaseReasonEnvironment

__all__ = ["CaseReasonEnvironment"]
