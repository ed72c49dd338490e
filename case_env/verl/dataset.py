"""CaseRLHFDataset: verl's RLHFDataset for the CASE schema, whose `extra_info` is a JSON string.

verl 0.9.1's `RLHFDataset.__getitem__` reads `extra_info` with `.get`, so it only accepts a struct; the
CASE-Bench banks (and ours) store a JSON string, which also keeps Arrow from merging `tools_kwargs`
structs across rows. This subclass decodes the string on access and changes nothing else. Select it with
`data.custom_cls.path=<this file> data.custom_cls.name=CaseRLHFDataset`.
"""

from __future__ import annotations

import json
from typing import Any

from verl.utils.dataset.rl_dataset import RLHFDataset


class _DecodedRows:
    """A view of a datasets.Dataset whose rows come back with `extra_info` decoded."""

    def __init__(self, dataframe: Any):
        self._dataframe = dataframe

    def __len__(self) -> int:
        return len(self._dataframe)

    def __getitem__(self, item: Any) -> Any:
        row = self._dataframe[item]
        if isinstance(item, int) and isinstance(row.get("extra_info"), str):
            row["extra_info"] = json.loads(row["extra_info"])
        return row

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dataframe, name)


class CaseRLHFDataset(RLHFDataset):
    def _read_files_and_tokenize(self) -> None:
        super()._read_files_and_tokenize()
        self.dataframe = _DecodedRows(self.dataframe)
