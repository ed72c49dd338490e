"""Bank rows as verl's RLHFDataset yields them, and scripted policies that answer them: shared by the verl
contract tests and the reliability suite's crash check."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from case_env.core.bank import write
from case_env.core.calls import call_text
from case_env.envs.imaging.bank.build import build
from case_env.envs.imaging.data.store import PatientStore
from case_env.verl.dataset import CaseRLHFDataset
from case_env.verl.offline import build_tokenizer

REPO = Path(__file__).resolve().parents[1]


def build_bank(dataset: Path, out: Path) -> Path:
    write(build(PatientStore(dataset), seed=3, fractions=(0.8, 0.1, 0.1)), out, {"seed": 3})
    return out


def dataset_config(**extra):
    return OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 16384,
            "filter_overlong_prompts": False,
            "return_raw_chat": True,
            "truncation": "error",
            **extra,
        }
    )


def rows(bank: Path, per_source: int) -> list[dict]:
    data = CaseRLHFDataset(
        data_files=[str(bank / "train.parquet")],
        tokenizer=build_tokenizer(),
        config=dataset_config(),
        processor=None,
    )
    chosen: dict[str, list] = {}
    for i in range(len(data)):
        item = data[i]
        bucket = chosen.setdefault(item["data_source"], [])
        if len(bucket) < per_source:
            bucket.append(item)
    assert set(chosen) == {"vista3d_opsd", "medpanel_v2_opsd", "medboard_opsd"}
    return [item for items in chosen.values() for item in items]


def script_for(item: dict, correct: bool, form: str = "hermes") -> list[str]:
    """The tool calls of the row's evidence in verl's `form`, then the right answer (or the next letter when
    not `correct`)."""
    extra = item["extra_info"]
    calls = [call_text("list_visits", {}, form)] + [
        call_text(e["tool"], e["arguments"], form) for e in extra["evidence"]
    ]
    letter = extra["ground_truth"] if correct else "ABCD"[("ABCD".index(extra["ground_truth"]) + 1) % 4]
    return [*calls, f"The evidence points to option {letter}.\n<answer>{letter}</answer>"]
