"""The world the real-model tests play in: one live server holding cases of the three environments, a small
bank of each, and the scripted agents' trajectories on them (what CASE's first stage learns from)."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from case_env.core.bank import write
from case_env.core.sft_data import write_sft
from case_env.envs.casereason import bank as reason_bank
from case_env.envs.casereason.cases import read_file
from case_env.envs.casereason.synth import write_cases
from case_env.envs.clinic import bank as clinic_bank
from case_env.envs.clinic.noise import NoiseConfig
from case_env.envs.clinic.synth import make_cases, write_csv
from case_env.eval.runner import run_eval
from tests.server_harness import live_server
from tests.test_clinic_server import env
from tests.verl_rows import build_bank

# the scripted agent each environment's first stage learns from
TEACHERS = {"imaging": "scripted", "clinic": "clinician", "casereason": "reader"}


@dataclass
class World:
    root: Path
    banks: dict[str, Path]  # environment -> bank directory
    url: str
    server: object

    @classmethod
    @contextlib.contextmanager
    def open(cls, dataset: Path, tmp: Path) -> Iterator[World]:
        write_csv(make_cases(24, seed=2), tmp / "clinic" / "clinic_synthetic.csv")
        clinic = clinic_bank.build(make_cases(24, seed=2), 2, (0.8, 0.1, 0.1), NoiseConfig())
        write(clinic, tmp / "banks" / "clinic", {"env": "clinic"})
        write_cases(24, 2, tmp / "casereason" / "c.jsonl")
        cases = read_file(tmp / "casereason" / "c.jsonl").cases
        write(reason_bank.build(cases, 2, (0.8, 0.1, 0.1), "sequential", 3), tmp / "banks" / "casereason", {})
        banks = {
            "imaging": build_bank(dataset, tmp / "banks" / "imaging"),
            "clinic": tmp / "banks" / "clinic",
            "casereason": tmp / "banks" / "casereason",
        }
        cases_env = {"CASE_ENV_CLINIC_CASES": tmp / "clinic", "CASE_ENV_CASEREASON_CASES": tmp / "casereason"}
        with contextlib.ExitStack() as stack:
            with env(**cases_env):  # read as the server starts, not left set for the rest of the session
                live = stack.enter_context(live_server(dataset, tmp))
            yield cls(dataset, banks, live.url, live)

    def episodes(self, episode_id: str) -> list[dict]:
        """The calls the server logged for an episode (GET /v1/episodes/{id})."""
        import httpx

        reply = httpx.get(f"{self.url}/v1/episodes/{episode_id}", timeout=10)
        return reply.json()["calls"] if reply.status_code == 200 else []

    def scripted_sft(self, out: Path, per_env: int, envs: tuple[str, ...]) -> Path:
        """The shortest `per_env` correct trajectories of each environment's scripted agent, as SFT rows."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables = []
        for name in envs:
            bank = self.banks[name]
            run = out / f"eval-{name}"
            run_eval(bank / "train.parquet", self.url, TEACHERS[name], run, limit=12, progress=False)
            write_sft(run, out / f"{name}.parquet")
            rows = pq.read_table(out / f"{name}.parquet").to_pylist()
            rows.sort(key=lambda r: len(json.dumps(r["messages"])))
            tables += rows[:per_env]
        for row in tables:
            row.pop("images", None)
        pq.write_table(pa.Table.from_pylist(tables), out / "sft.parquet")
        return out / "sft.parquet"

    def tuned(self, model: Path, out: Path) -> Path:
        from case_env.trl.train import SFTRun, run_sft

        os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
        # imaging's calls and answer: what the later tests need the model to write (every conversation added
        # costs its tokens in each step, and a CPU's time is what this fixture spends)
        data = self.scripted_sft(out, per_env=1, envs=("imaging",))
        run = SFTRun(
            str(model),
            data,
            out / "sft",
            epochs=4,
            learning_rate=5e-4,
            batch_size=2,
            max_length=3072,
            warmup_ratio=0.0,
            checkpoints=False,
            gradient_checkpointing=False,  # one conversation: the time matters, not the memory
        )
        return in_own_process(run_sft, run)


def in_own_process(train: Callable, run: object) -> Path:
    """`train(run)` in a process of its own, as `case-env train trl` runs: importing a trainer beside this
    suite's server and engine threads once failed with CPython 3.11's "AST constructor recursion depth
    mismatch" (its ast module counts depth in one place for all threads, gh-106905), and the trainer's memory
    goes back when the process ends. The settings of this process's environment are inherited."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(train, (run,))
