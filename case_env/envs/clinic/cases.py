"""Clinic cases: MedExAgent's case table (`rl/train_patients.csv`), its evaluation JSONL and its verl parquet
(`train_verl.parquet`), read into one shape.

The CSV has demographics (`age, gender, race, additional_demographics`), `medical_history`, `diagnosis`,
`self_reported_symptoms`, up to nine exams as tool-call strings (`exam1`…, e.g. `ct(region="chest",
contrast="yes")`) with their findings (`exam1_findings`…) and `source` (pmc or ddxplus); the JSONL has one
patient per line with demographics as an object, a `patient_persona` and a `conversation` whose tool calls
and tool messages hold the exams and findings; a parquet row carries in `extra_info` the exam map, the tools
offered to the case and the noise assigned to it, which are kept (docs/sources.md, MedExAgent). Exams are
read as MedExAgent reads them (`case_env.medicine.exams`); as there, an exam without findings is not part of
the work-up, and an exam recorded twice counts once. An exam that the vocabulary cannot express is left out
of its case and reported, never guessed; a row without a diagnosis or symptoms is reported and skipped. Case
ids are `<file stem>-<row>` (CSV, parquet) or `<file stem>-<patient_id>`. A CSV row has no persona, so it
gets the one MedExAgent's dataset builder draws for its row (`sample_patient_persona(Random(row))`).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from case_env.core.calls import chat_call
from case_env.core.casefiles import gather, records, split_of
from case_env.core.frozen import FrozenDraw
from case_env.medicine.exams import ExamCall, ExamError, RecordedExam, loaded_exam, raw_findings

MAX_EXAMS = 10
SOURCES = {"ddxplus": "clinic_ddxplus", "pmc": "clinic_pmc", "synthetic": "clinic_synthetic"}
# MedExAgent's persona options in its order (data/prompt.py PATIENT_PERSONA_OPTIONS), for its draws.
PERSONALITIES = ("verbose", "pleasing", "impatient", "distrust", "overanxious", "plain")
LANGUAGES = ("A", "B", "C")  # its keys level_a, level_b, level_c
RECALLS = ("low", "high")
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass(frozen=True)
class Persona:
    """How the simulated patient talks (PatientSim's axes, as MedExAgent samples them)."""

    personality: str = "plain"  # plain, verbose, pleasing, impatient, distrust, overanxious
    language: str = "C"  # A low, B moderate, C native proficiency
    recall: str = "high"  # high or low recall of the medical history


@dataclass(frozen=True)
class AssignedNoise:
    """Noise a MedExAgent parquet row arrives with: its patient noise types and exam slot -> noise type."""

    patient: tuple[str, ...] = ()
    exams: tuple[tuple[int, str], ...] = ()


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
    offered: tuple[str, ...] | None = None  # exam tools a MedExAgent parquet row offers; None: drawn per bank
    noise: AssignedNoise | None = None  # noise a MedExAgent parquet row assigns; None: planned per bank
    split: str = ""  # the split its file's name gives ("train_patients.csv", "pmc_test_....jsonl"), or ""
    conversation: tuple[dict, ...] = ()  # a conversation file's recorded consultation, as written
    gold: tuple[str, ...] = ()  # its every exam call as written, repeats kept (what MedExAgent's eval scores)
    # how MedExAgent's prompt builder writes this case's empty fields: "nan" for a case table (pandas reads an
    # empty cell as NaN and the builder prints it) and a parquet row holding them, nothing for a JSON record
    blank: str = ""

    @property
    def data_source(self) -> str:
        return SOURCES.get(self.source, "clinic_synthetic")

    def findings(self, call: ExamCall) -> list[tuple[int, str]]:
        """(slot, findings) of every recorded exam identical to `call`: strict, no name-only fallback."""
        return [(slot, e.findings) for slot, e in enumerate(self.exams) if e.call == call]

    def demographic_lines(self, blank: str | None = None) -> str:
        """The demographics as MedExAgent's RL prompt lays them out (`_format_demographics`): one labelled
        line per field, an empty one written as `blank` (the case's own by default) or left out when that is
        empty, as its builder's docstring intends."""
        blank = self.blank if blank is None else blank
        fields = (
            ("Age", self.age),
            ("Gender", self.gender),
            ("Race/Ethnicity", self.race),
            ("Other", self.other_demographics),
        )
        lines = [f"{label}: {value or blank}" for label, value in fields if value or blank]
        return "\n".join(lines) or "Not specified"

    def history_text(self, blank: str | None = None) -> str:
        """The medical history as MedExAgent's prompt gives it (an empty one as `blank`, else its default)."""
        blank = self.blank if blank is None else blank
        return self.history or blank or "No known past medical history."

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
    """A cell as text; an empty cell is "" however it was written. pandas writes one as "nan" (MedExAgent's
    CSVs have them, and its prompt builder prints them: "Race/Ethnicity: nan"); we read it as empty, which is
    what that builder's docstring says it does ("any empty/None field is silently omitted")."""
    text = "" if value is None else str(value).strip()
    return "" if text.lower() == "nan" else text


def _case_id(stem: str, local: str) -> str:
    return _ID_UNSAFE.sub("-", f"{stem}-{local}").strip("-")[:64]


def _source(value: str, path: Path) -> str:
    text = (value or path.stem).lower()
    return next((s for s in SOURCES if s in text), "synthetic")


def _exams(pairs: Iterable[tuple[str, str]], where: str, problems: list[str]) -> tuple[RecordedExam, ...]:
    """The work-up as MedExAgent's exam map holds it: exams with findings, one per exam (the last wins)."""
    out: dict[ExamCall, RecordedExam] = {}
    for spelled, findings in pairs:
        if not spelled:
            continue
        if not findings:
            problems.append(f"{where}: exam {spelled[:60]!r} has no findings, left out (as in MedExAgent)")
            continue
        try:
            exam, notes = loaded_exam(spelled, findings)
        except ExamError as exc:
            problems.append(f"{where}: exam {spelled[:60]!r} left out ({exc})")
            continue
        problems += [
            f"{where}: exam {spelled[:60]!r}: {note} (as MedExAgent's loader keeps it)" for note in notes
        ]
        out[exam.call] = exam
    return tuple(out.values())


def _case(
    case_id: str,
    row: dict,
    exams: tuple[RecordedExam, ...],
    source: str,
    persona,
    where: str,
    problems: list[str],
    **more,
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
        **more,
    )


def medexagent_persona(row: int) -> Persona:
    """The persona MedExAgent's dataset builder gives CSV row `row` (`sample_patient_persona(Random(row))`)."""
    rng = random.Random(row)
    return Persona(rng.choice(PERSONALITIES), rng.choice(LANGUAGES), rng.choice(RECALLS))


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
            medexagent_persona(n),
            where,
            load.problems,
            split=split_of(path),
            blank="nan",
        )
        if case is not None:
            load.cases.append(case)
    return load


def _persona(raw: object) -> Persona | None:
    """MedExAgent's persona record (`{"personality": {"key": ...}, "language_proficiency": {"key": "level_b"},
    "medical_history_recall": {"key": "low"}}`, or bare keys); our own `recall` key is read too."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            return None
    if not isinstance(raw, dict):
        return None

    def key(*axes: str) -> str:
        for axis in axes:
            value = raw.get(axis)
            found = _clean(value.get("key") if isinstance(value, dict) else value)
            if found:
                return found.lower()
        return ""

    personality = key("personality")
    language = key("language_proficiency").removeprefix("level_").upper()
    recall = key("medical_history_recall", "recall")
    return Persona(
        personality if personality in PERSONALITIES else "plain",
        language if language in LANGUAGES else "C",
        recall if recall in RECALLS else "high",
    )


def _conversation_exams(conversation: list) -> list[tuple[str, str]]:
    """(exam string, findings) from a conversation's tool calls and the tool messages that answer them. A tool
    message holds MedExAgent's result sentence ("The CT scan of the chest shows: ..."); the findings inside
    it are kept, so the server's answer wraps them once, as in training."""
    calls: dict[str, tuple[str, dict]] = {}
    pairs = []
    for message in conversation or []:
        if not isinstance(message, dict):
            continue
        for call in message.get("tool_calls") or []:
            name, arguments = chat_call(call)
            calls[call.get("id", "")] = (name, arguments if isinstance(arguments, dict) else {})
        if message.get("role") == "tool" and message.get("tool_call_id") in calls:
            name, arguments = calls.pop(message["tool_call_id"])
            inner = ", ".join(f'{k}="{v}"' for k, v in arguments.items())
            pairs.append((f"{name}({inner})", raw_findings(name, arguments, _clean(message.get("content")))))
    return pairs


def offered_in(conversation: list) -> tuple[str, ...] | None:
    """The exam tools a conversation's system prompt lists (`- Name: ct`), as MedExAgent's evaluation reads
    them (`parse_available_tools_from_system_prompt`); None when it lists none."""
    system = next((m for m in conversation or [] if isinstance(m, dict) and m.get("role") == "system"), None)
    names = re.findall(r"- Name:\s*(\w+)", str((system or {}).get("content") or ""))
    return tuple(dict.fromkeys(names)) or None


def read_jsonl(path: Path) -> CaseLoad:
    load = CaseLoad()
    for n, where, record, problem in records(path):
        if record is None:
            load.problems.append(f"{where}: skipped, {problem}")
            continue
        demographics = record.get("demographics")
        row = {**record, **(demographics if isinstance(demographics, dict) else {})}
        conversation = record.get("conversation") if isinstance(record.get("conversation"), list) else []
        pairs = _conversation_exams(conversation)
        exams = _exams(pairs, where, load.problems)
        local = _clean(record.get("patient_id")) or f"{n:05d}"
        case = _case(
            _case_id(path.stem, local),
            row,
            exams,
            _source(_clean(record.get("source")), path),
            _persona(record.get("patient_persona")),
            where,
            load.problems,
            split=split_of(path),
            offered=offered_in(conversation),
            conversation=tuple(m for m in conversation if isinstance(m, dict)),
            gold=tuple(spelled for spelled, _ in pairs),
        )
        if case is not None:
            load.cases.append(case)
    return load


def _json(value: object, default):
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return default
    return default if value is None else value


def read_parquet(path: Path) -> CaseLoad:
    """MedExAgent's verl rows (`train/rl/dataset.py` build_verl_dataset): JSON strings inside `extra_info`."""
    load = CaseLoad()
    for n, where, record, _problem in records(path):
        extra = _json(record.get("extra_info"), {})
        exam_map = _json(extra.get("exam_map"), None) if isinstance(extra, dict) else None
        if not isinstance(exam_map, dict):
            load.problems.append(f"{where}: skipped, not a MedExAgent row (no extra_info.exam_map)")
            continue
        pairs = [
            (spelled, _clean(info.get("findings") if isinstance(info, dict) else info))
            for spelled, info in exam_map.items()
        ]
        exams = _exams(pairs, where, load.problems)
        kept = {e.spelled: slot for slot, e in enumerate(exams)}
        noise_map = _json(extra.get("exam_noise_map"), {}) or {}
        interaction = _json(extra.get("interaction_kwargs"), {}) or {}
        noise = AssignedNoise(
            tuple(str(t) for t in interaction.get("assigned_noise_types") or ()),
            tuple(sorted((kept[s], str(t)) for s, t in noise_map.items() if s in kept)),
        )
        demographics = _json(extra.get("demographics"), {}) or {}
        truth = (record.get("reward_model") or {}).get("ground_truth")
        row = {
            **demographics,
            "diagnosis": extra.get("ground_truth") or truth,
            "self_reported_symptoms": extra.get("self_reported_symptoms"),
            "medical_history": extra.get("medical_history"),
        }
        offered = _json(extra.get("available_tools"), None)
        index = extra.get("patient_index", n)
        case = _case(
            _case_id(path.stem, f"{int(index):05d}" if str(index).isdigit() else str(index)),
            row,
            exams,
            _source(_clean(extra.get("data_source") or record.get("data_source")), path),
            _persona(extra.get("patient_persona")),
            where,
            load.problems,
            offered=tuple(str(t) for t in offered) if isinstance(offered, list) else None,
            noise=noise,
            split=split_of(path),
            blank="nan" if any(str(v).strip().lower() == "nan" for v in row.values()) else "",
        )
        if case is not None:
            load.cases.append(case)
    return load


_READERS = {".jsonl": read_jsonl, ".csv": read_csv, ".parquet": read_parquet}


def load_cases(paths: Iterable[Path]) -> CaseLoad:
    """Every case of the given CSV, JSONL and parquet files, or of those files inside given directories."""
    return gather(paths, tuple(_READERS), lambda file: _READERS[file.suffix](file), "clinic", CaseLoad())


def persona_of(case: ClinicCase) -> Persona:
    """The case's own persona, or one drawn from its id, the same on every worker."""
    if case.persona is not None:
        return case.persona
    draw = FrozenDraw(0, f"clinic/persona/{case.case_id}")
    return Persona(
        draw.choice("personality", PERSONALITIES),
        draw.choice("language", LANGUAGES),
        draw.choice("recall", RECALLS),
    )
