"""The imaging environment (CASE): patient-scoped tools over longitudinal whole-body Dixon MRI, multiple-choice
questions for three personas, a letter reward."""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from case_env.core.bank import CASE_EXTRA, Item, reference_rows
from case_env.core.calls import ScoreExtra
from case_env.core.environment import Environment, Score, row_weights
from case_env.core.errors import CommandError
from case_env.core.parts import (
    BankBuild,
    BankOptions,
    Benchmarks,
    Commands,
    Data,
    DataCheck,
    Evaluation,
    PolicyFactory,
    Recipe,
    ServerBenchOptions,
    SynthOptions,
    Training,
    Variant,
)
from case_env.core.personas import Personas
from case_env.core.tools import Tools
from case_env.envs.imaging import evaluation
from case_env.envs.imaging.bench.mixes import MIXES
from case_env.envs.imaging.recipes import RECIPES
from case_env.envs.imaging.reward import COMPONENTS
from case_env.envs.imaging.rubric import GRADER, ImagingScoreExtra
from case_env.envs.imaging.terms import ImagingFault

if TYPE_CHECKING:
    import typer

    from case_env.envs.imaging.store import ImagingCases
    from case_env.settings import DataSettings

CASE_SOURCES = ("vista3d_opsd", "medpanel_v2_opsd", "medboard_opsd")  # Anatomist, Radiologist, Consultant
KEY_ORGANS = ("liver", "spleen", "pancreas", "left_kidney", "right_kidney", "gallbladder", "stomach", "heart")


class ImagingSynthOptions(SynthOptions):
    profile: Literal["ci", "full"] = Field(
        "ci", description="ci (112x87x185, fast) or full (224x174x370, UK Biobank grid)."
    )
    force: bool = Field(False, description="Replace an existing synthetic dataset with other settings.")
    jobs: int = Field(0, ge=0, description="Worker processes (0: one per CPU).")
    format: Literal["nifti", "ukb-dicom"] = Field(
        "nifti",
        description="nifti: a data root; ukb-dicom: UK Biobank field-20201 zips (<eid>_20201_<instance>_0.zip) "
        "of every visit, for `case-env ingest ukb`.",
    )
    source: Path | None = Field(
        None,
        description="ukb-dicom: the synthetic data root to convert (default: generated in a temporary directory).",
    )


class ImagingBankOptions(BankOptions):
    truth: Literal["measured", "manifest"] = Field(
        "measured",
        description="measured: answers from the measurements the tools serve (real data); manifest: from "
        "the synthetic phantom manifests, to check the measured truth against.",
    )
    clinical: Path | None = Field(
        None, description="Diagnoses table (default: <data-root>/phenotype/diagnoses.tsv when present)."
    )


class ImagingEnvironment(Environment, Data, Evaluation, Training, Benchmarks, Commands):
    name = "imaging"
    title = "imaging"
    summary = (
        "CASE: patient-scoped tools over longitudinal Dixon MRI; multiple-choice questions, letter reward."
    )
    tools = Tools("case_env.tools.imaging")
    personas = Personas("case_env.personas.imaging")
    fault_codes = tuple(ImagingFault)
    bench_mixes = MIXES
    synth_options = ImagingSynthOptions
    bank_options = ImagingBankOptions
    required_extra = ("options", *CASE_EXTRA)
    baselines = ("scripted", "vision", "no-tool", "random")
    loop_agent = "vision"
    floors = ("random", "no-tool")
    score_extra = ImagingScoreExtra
    components = COMPONENTS
    max_turns = 32
    figures = evaluation  # summarise, summary_lines, report
    default = True
    recipes: ClassVar[dict[str, Recipe]] = RECIPES  # CASE's RL stage and its ablations

    rule_graded = f"{GRADER}=rules"

    def asks_judge(self, settings: Mapping[str, str], weights: Mapping[str, float]) -> bool:
        """Only a weighted rubric asks the judge, unless it is left to the rules (rubric.py)."""
        rubric = row_weights(COMPONENTS, weights)["rubric"]
        return rubric > 0 and settings.get(GRADER, "judge") == "judge"

    def bench_server(self, options: ServerBenchOptions, echo: Callable[[str], object]) -> dict:
        from case_env.envs.imaging.bench.server import bench_server

        return bench_server(options, echo)

    def __init__(self, store_class: type | None = None, imaging_class: type | None = None):
        # the benchmark's naive reference engine swaps the data engine behind the same tools
        self.store_class = store_class
        self.imaging_class = imaging_class

    def open_cases(self, data: DataSettings) -> ImagingCases:
        from case_env.envs.imaging.data.store import PatientStore
        from case_env.envs.imaging.settings import ImagingSettings
        from case_env.envs.imaging.store import ImagingCases
        from case_env.envs.imaging.viewer.service import Imaging

        settings = ImagingSettings.of(data)
        patients = (self.store_class or PatientStore)(settings=settings)
        return ImagingCases(patients, (self.imaging_class or Imaging)(patients, settings.image_max_side))

    def tool_context(self, cases, case_id, episode):
        return _context_class()(cases, case_id, episode)

    # -- banks and rewards ------------------------------------------------------------------------------
    def build_bank(self, options: BankOptions) -> BankBuild:
        from case_env.core.problems import Problems
        from case_env.envs.imaging.bank.build import build
        from case_env.envs.imaging.clinical import load_clinical
        from case_env.envs.imaging.data.store import PatientStore

        if options.data_root is None:
            raise CommandError("--data-root is required for an imaging bank", 2)
        store = PatientStore(options.data_root)
        if store.index.errors or not store.patient_ids():
            problems = "; ".join(str(p) for p in store.index.errors[:10]) or "no patients"
            raise CommandError(
                f"{options.data_root} is not a usable data root ({problems}; see `case-env data check`)"
            )
        assert isinstance(options, ImagingBankOptions)
        if options.clinical is not None and not options.clinical.is_file():
            raise CommandError(f"--clinical {options.clinical}: no such file", 2)
        clinical = load_clinical(store, options.clinical)
        problems = Problems(clinical.problems if clinical else [])
        diagnoses = clinical.diagnoses if clinical else None
        result = build(store, options.seed, options.split, options.truth, diagnoses)
        sources = CASE_SOURCES
        table = [
            f"{'split':6s} {'patients':>8s} " + " ".join(f"{s:>17s}" for s in sources) + f" {'total':>6s}"
        ]
        for name, counts in result.counts().items():
            cells = " ".join(f"{counts.get(s, 0):17d}" for s in sources)
            table.append(f"{name:6s} {len(result.cases[name]):8d} {cells} {sum(counts.values()):6d}")
        meta = {
            "seed": options.seed,
            "split": options.split,
            "data_root": str(store.root),
            "truth": options.truth,
            "clinical": clinical.source if clinical else None,
        }
        return BankBuild(result, meta, table, problems)

    async def score(self, solution_str: str, ground_truth: str, extra: ScoreExtra | Mapping | None) -> Score:
        from case_env.envs.imaging.reward import rubric_score

        return await rubric_score(solution_str, ground_truth, extra)

    def check_row(self, row: dict, extra: dict) -> list[str]:
        options = extra.get("options")
        if "options" not in extra:
            return []
        if isinstance(options, dict):
            letters = [str(k).strip().upper() for k in options]
        elif isinstance(options, list):
            letters = list("ABCDEFGHIJ"[: len(options)])
        else:
            return ["extra_info.options must be a list or an object keyed by letter"]
        truth = (
            (row.get("reward_model") or {}).get("ground_truth")
            if isinstance(row.get("reward_model"), dict)
            else None
        )
        if truth and str(truth).strip().strip("()").upper() not in letters:
            return [f"ground truth {truth!r} is not one of the options {', '.join(letters)}"]
        return []

    # -- data -----------------------------------------------------------------------------------------
    def check_data(self, root: Path) -> DataCheck | None:
        from case_env.envs.imaging.clinical import load_clinical
        from case_env.envs.imaging.data.check import check_root
        from case_env.envs.imaging.data.index import holds_imaging

        if root.is_dir() and not holds_imaging(root):
            return None  # the root holds other environments' cases only
        from case_env.envs.imaging.data.store import PatientStore
        from case_env.envs.imaging.idps import compare, load_idps

        report = check_root(root)
        summary = report.to_json()
        lines = [f"data root {report.root}: {len(report.patients)} patients (volumes in mL)"]
        lines.append(
            f"{'patient':10s} {'visit':10s} {'date':10s} "
            + " ".join(f"{o[:12]:>12s}" for o in KEY_ORGANS)
            + "  organs"
        )
        for patient in report.patients:
            for v in patient.visits:
                cells = " ".join(
                    f"{v.organs[o]:12.1f}" if o in v.organs else f"{'-':>12s}" for o in KEY_ORGANS
                )
                lines.append(
                    f"{patient.patient_id:10s} {v.visit:10s} {v.acq_date or '-':10s} {cells}  {len(v.organs)}"
                )
        warnings = [str(p) for p in report.warnings]
        store = None if report.errors else PatientStore(root)
        clinical = load_clinical(store) if store else None
        idps = load_idps(store) if store else None
        if idps is not None:
            lines.append(f"imaging-derived phenotypes {idps.source} (ours beside them):")
            compared, disagree = compare(store, idps)
            lines += compared
            warnings += [f"{p} (row not used)" for p in idps.problems] + disagree
        if clinical is not None:
            patients = sum(1 for v in clinical.diagnoses.values() if v)
            records = sum(len(v) for v in clinical.diagnoses.values())
            lines.append(f"clinical table {clinical.source}: {records} diagnoses of {patients} patients")
            warnings += [f"{p} (row not used)" for p in clinical.problems]
        return DataCheck(
            {
                "root": summary["root"],
                "patients": summary["patients"],
                "clinical": clinical.source if clinical else None,
                "phenotypes": idps.source if idps else None,
            },
            lines,
            [str(p) for p in report.errors],
            warnings,
        )

    def synthesize(self, options: SynthOptions, echo: Callable[[str], object]) -> None:
        assert isinstance(options, ImagingSynthOptions)
        if options.format == "ukb-dicom":
            self._synthesize_zips(options, echo)
            return
        self._synthesize_root(options, echo)

    def _synthesize_zips(self, options: ImagingSynthOptions, echo: Callable[[str], object]) -> None:
        import tempfile

        from case_env.envs.imaging.ukb.dicom import ZipError
        from case_env.envs.imaging.ukb.synthetic import write_ukb_zips

        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="case-env-synth-") as tmp:
            source = options.source
            if source is None:
                source = Path(tmp) / "root"
                self._synthesize_root(options.model_copy(update={"out": source, "format": "nifti"}), echo)
            try:
                zips = write_ukb_zips(source, options.out, options.seed, echo, options.force)
            except ZipError as exc:
                raise CommandError(str(exc)) from None
        echo(
            f"wrote {len(zips)} UK Biobank-style zips to {options.out} in {time.perf_counter() - start:.1f} s"
        )

    def _synthesize_root(self, options: ImagingSynthOptions, echo: Callable[[str], object]) -> None:
        from case_env.envs.imaging.synth.writer import DatasetExistsError, generate_dataset

        workers = options.jobs or os.cpu_count() or 1
        start = time.perf_counter()

        def progress(s) -> None:
            per_visit = ", ".join(f"{t:.1f}" for t in s.seconds_per_visit)
            echo(f"  {s.public_id} ({s.subject}) {s.sex} {s.age}y {s.scenario:26s} {per_visit} s/visit")

        try:
            summaries, written = generate_dataset(
                options.out, options.patients, options.profile, options.seed, options.force, workers, progress
            )
        except DatasetExistsError as exc:
            raise CommandError(str(exc)) from None
        if not written:
            echo(
                f"{options.out}: {options.patients} {options.profile}-profile patients with seed {options.seed} "
                "already present; nothing to do"
            )
            return
        echo(f"wrote {len(summaries)} patients to {options.out} in {time.perf_counter() - start:.1f} s")

    # -- evaluation -----------------------------------------------------------------------------------
    def policy_factory(self, agent: str, bank: Path, seed: int) -> PolicyFactory:
        from case_env.envs.imaging.baselines import scripted_agent
        from case_env.envs.imaging.baselines.naive import LeavePatientOut, NoToolAgent, RandomAgent
        from case_env.envs.imaging.baselines.scripted import TextAgent

        if agent == "scripted":
            return lambda item, _variant, _repeat: TextAgent(
                item.extra
            )  # tool text only, also on image questions
        if agent == "vision":  # pixels for image questions; a vision policy reads the text of the others
            return lambda item, _variant, _repeat: scripted_agent(item.extra)
        if agent == "random":
            return lambda item, _variant, repeat: RandomAgent(item.extra, seed + repeat)
        if agent == "no-tool":
            priors = LeavePatientOut(reference_rows(bank))
            lock = threading.Lock()  # agents are made on several threads; fit each patient's prior once

            def no_tool(item: Item, _variant: Variant, repeat: int):
                with lock:
                    return NoToolAgent(item.extra, seed + repeat, priors)

            return no_tool
        raise ValueError(f"unknown {self.title} agent {agent!r}")

    def record_fields(self, item: Item) -> dict:
        extra = item.extra
        return {
            "template": extra.get("template"),
            "scenario": extra.get("scenario", ""),
            "answer_type": "mcq",
            "teacher_insight": extra.get("teacher_insight", ""),
            "options": len(extra["options"]),
        }

    # -- command line ---------------------------------------------------------------------------------
    def cli(self, groups: dict[str, typer.Typer]) -> None:
        from case_env.envs.imaging.cli import register

        register(groups)


@functools.cache
def _context_class() -> type:
    """ImagingContext, imported on first use (it pulls in the renderer) and once: an import statement in
    `tool_context` cost 2 % of a cheap call (py-spy profile)."""
    from case_env.envs.imaging.context import ImagingContext

    return ImagingContext
