"""verl integration: the HTTP tool adapter, the dataset class for CASE-schema parquet, the tool YAML.

`case_env.verl.CaseTool` and `case_env.verl.CaseRLHFDataset` import verl (and torch) on first use only, so
the rest of case-env, and `case-env verl-config`, work without verl installed.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "CaseTool":
        from case_env.verl.tool import CaseTool

        return CaseTool
    if name == "CaseRLHFDataset":
        from case_env.verl.dataset import CaseRLHFDataset

        return CaseRLHFDataset
    raise AttributeError(name)
