"""Clinic cases: MedExAgent's case table (`rl/train_patients.csv`) and evaluation JSONL, read into one shape.

The CSV has demographics (`age, gender, race, additional_demographics`), `medical_history`, `diagnosis`,
`self_reported_symptoms`, up to nine exams as tool-call strings (`exam1`…, e.g. `ct(region="chest",
contrast="yes")`) with their findings (`exam1_findings`…) and `source` (pmc or ddxplus); the JSONL has one
patient per line with demographics as an object, a `patient_persona` and a `conversation` whose tool calls
and tool messages hold the exams and findings (docs/sources.md, MedExAgent). An exam that the
catalogue cannot express is left out of its case and reported, never guessed; a row without a diagnosis or
symptoms is reported and skipped. Case ids are `<file stem>-<row>` (CSV) or `<file stem>-<patient_id>`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from case_env.core.casefiles import gather, records
from case_env.core.frozen import FrozenDraw
from case_env.medicine.exams import ExamCall, ExamError, RecordedExam, exam_call, parse_exam_string

MAX_EXAMS = 10
SOURCES = {"ddxplus": "clinic_ddxplus", "pmc": "clinic_pmc", "synthetic": "clinic_synthetic"}
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass(frozen=True)
class Persona:
    """How the simulated patient talks (PatientSim's axes, as MedExAgent samples them)."""

    personality: str = "plain"  # plain, verbose, pleasing, impatient, distrust, overanxious
    language: str = "C"  # A low, B moderate, C native proficiency
    recall: str = "high"  # high or low recall of the medical history


@dataclass(frozen=True)
class ClinicCase:
    case_id: str
    source: str  # ddxplus, pmc or synthetic
    diagnosis: str
    symptoms: str
    age: str = ""
    gender: str = ""
    race: str = ""
    other_demographics: str = ""
    history: str = ""
    exams: tuple[RecordedExam, ...] = ()
    persona: Persona | None = None  # None: drawn per case from its id

    @property
    def data_source(self) -> str:
        return SOURCES.get(self.source, "clinic_synthetic")

    def findings(self, call: ExamCall) -> list[tuple[int, str]]:
        """(slot, findings) of every recorded exam identical to `call`: strict, no name-only fallback."""
        return [(slot, e.findings) for slot, e in enumerate(self.exams) if e.call == call]

    def demographics(self) -> str:
        parts = [p for p in (_age_words(self.age), _gender_word(self.gender), self.race) if p]
        text = ", ".join(parts) if parts else "not recorded"
        return f"{text}; {self.other_demographics}" if self.other_demographics else text


@dataclass
class CaseLoad:
    cases: list[ClinicCase] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # rows skipped and exams left out, with reasons


def _age_words(age: str) -> str:
    age = str(age or "").strip()
    if not age:
        return ""
    return f"{age} years old" if age.replace(".", "", 1).isdigit() else age


def _gender_word(gender: str) -> str:
    return {"m": "male", "f": "female"}.get(str(gender or "").strip().lower(), str(gender or "").strip())


def _clean(value: object) -> str:
    return "" if value is None else str(value).strip()


def _case_id(stem: str, local: str) -> str:
    return _ID_UNSAFE.sub("-", f"{stem}-{local}").strip("-")[:64]


def _source(value: str, path: Path) -> str:
    text = (value or path.stem).lower()
    return next((s for s in SOURCES if s in text), "synthetic")


def _exams(pairs: Iterable[tuple[str, str]], where: str, problems: list[str]) -> tuple[RecordedExam, ...]:
    out = []
    for spelled, findings in pairs:
        if not spelled:
            continue
        try:
            out.append(RecordedExam(parse_exam_string(spelled), findings))
        except ExamError as exc:
            problems.append(f"{where}: exam {spelled[:60]!r} left out ({exc})")
    return tuple(out)


def _case(
    case_id: str,
    row: dict,
    exams: tuple[RecordedExam, ...],
    source: str,
    persona,
    where: str,
    problems: list[str],
) -> ClinicCase | None:
    diagnosis, symptoms = _clean(row.get("diagnosis")), _clean(row.get("self_reported_symptoms"))
    if not diagnosis or not symptoms:
        missing = "diagnosis" if not diagnosis else "self_reported_symptoms"
        problems.append(f"{where}: skipped, no {missing}")
        return None
    return ClinicCase(
        case_id,
        source,
        diagnosis,
        symptoms,
        _clean(row.get("age")),
        _clean(row.get("gender")),
        _clean(row.get("race")),
        _clean(row.get("additional_demographics")),
        _clean(row.get("medical_history")),
        exams,
        persona,
    )


def read_csv(path: Path) -> CaseLoad:
    load = CaseLoad()
    for n, where, row, _problem in records(path):
        pairs = [
            (_clean(row.get(f"exam{i}")), _clean(row.get(f"exam{i}_findings")))
            for i in range(1, MAX_EXAMS + 1)
        ]
        exams = _exams(pairs, where, load.problems)
        case = _case(
            _case_id(path.stem, f"{n:05d}"),
            row,
            exams,
            _source(_clean(row.get("source")), path),
            None,
            where,
            load.problems,
        )
        if case is not None:
            load.cases.append(case)
    return load


def _persona(raw: object) -> Persona | None:
    if not isinstance(raw, dict):
        return None

    def key(axis: str, default: str) -> str:
        value = raw.get(axis)
        return _clean(value.get("key") if isinstance(value, dict) else value) or default

    return Persona(key("personality", "plain"), key("language_proficiency", "C"), key("recall", "high"))


def _conversation_exams(conversation: list) -> list[tuple[str, str]]:
    """(exam string, findings) from a conversation's tool calls and the tool messages that answer them."""
    calls: dict[str, str] = {}
    pairs = []
    for message in conversation or []:
        if not isinstance(message, dict):
            continue
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            try:
                arguments = json.loads(function.get("arguments") or "{}")
            except json.JSONDecodeError:
                arguments = {}
            inner = ", ".join(f'{k}="{v}"' for k, v in (arguments or {}).items())
            calls[call.get("id", "")] = f"{function.get('name', '')}({inner})"
        if message.get("role") == "tool" and message.get("tool_call_id") in calls:
            pairs.append((calls.pop(message["tool_call_id"]), _clean(message.get("content"))))
    return pairs


def read_jsonl(path: Path) -> CaseLoad:
    load = CaseLoad()
    for n, where, record, problem in records(path):
        if record is None:
            load.problems.append(f"{where}: skipped, {problem}")
            continue
        demographics = record.get("demographics")
        row = {**record, **(demographics if isinstance(demographics, dict) else {})}
        exams = _exams(_conversation_exams(record.get("conversation")), where, load.problems)
        local = _clean(record.get("patient_id")) or f"{n:05d}"
        case = _case(
            _case_id(path.stem, local),
            row,
            exams,
            _source(_clean(record.get("source")), path),
            _persona(record.get("patient_persona")),
            where,
            load.problems,
        )
        if case is not None:
            load.cases.append(case)
    return load


def load_cases(paths: Iterable[Path]) -> CaseLoad:
    """Every case of the given CSV and JSONL files, or of those files inside given directories."""

    def read(file: Path) -> CaseLoad:
        return read_jsonl(file) if file.suffix == ".jsonl" else read_csv(file)

    return gather(paths, (".csv", ".jsonl"), read, "clinic", CaseLoad())


PERSONALITIES = ("plain", "verbose", "pleasing", "impatient", "distrust", "overanxious")
LANGUAGES = ("A", "B", "C")


def persona_of(case: ClinicCase) -> Persona:
    """The case's own persona, or one drawn from its id (a CSV row has none), the same on every worker."""
    if case.persona is not None:
        return case.persona
    draw = FrozenDraw(0, f"clinic/persona/{case.case_id}")
    return Persona(
        draw.choice("personality", PERSONALITIES),
        draw.choice("language", LANGUAGES),
        "low" if draw.chance("recall", 0.3) else "high",
    )


def exam_of(arguments: dict[str, str | None]) -> ExamCall:
    """An `order_exam` call's arguments → the canonical exam (raises ExamError)."""
    arguments = dict(arguments)
    return exam_call(str(arguments.pop("exam", "")), arguments)
