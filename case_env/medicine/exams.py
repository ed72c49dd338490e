"""The exam catalogue: every exam a clinician may order, its parameters, and its cost and discomfort tiers.

Names and parameter vocabularies follow MedExAgent's exam tools (docs/sources.md, MedExAgent), so
its case tables load unchanged; tiers follow its EXAM_COST table (Low 1, Medium 2, High 3 for cost and
for discomfort; an exam's charge is their sum, 2 to 6). Unlike MedExAgent, one tool (`order_exam`) carries
the exam as an enum, and matching is strict: an exam matches a recorded one only when its name and every
parameter agree after defaults are filled in, so a wrong region never returns another region's findings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# The parameter vocabularies, wrapped as a table.
# fmt: off
REGIONS = ("head", "neck", "chest", "abdomen", "pelvis", "spine", "upper_extremity", "lower_extremity",
           "whole_body", "heart", "breast", "kidney", "liver")
SOURCES = ("blood", "urine", "sputum", "stool", "csf", "wound", "throat", "nasopharyngeal", "pleural_fluid",
           "peritoneal_fluid", "synovial_fluid", "tissue", "skin", "vaginal")
SITES = ("skin", "lymph_node", "liver", "kidney", "lung", "bone", "bone_marrow", "breast", "thyroid",
         "colon", "stomach", "prostate", "muscle", "brain", "pancreas", "cervix", "temporal_artery")
TYPES = ("egd", "colonoscopy", "bronchoscopy", "sigmoidoscopy", "cystoscopy", "laryngoscopy", "ercp",
         "capsule", "transthoracic", "transesophageal", "exercise", "pharmacologic", "doppler",
         "ct_angiography", "coronary", "pulmonary", "cerebral", "ventilation_perfusion", "bone_scan",
         "thyroid_scan", "hida", "gallium", "routine", "pcr", "antigen", "antibody")
TARGETS = ("tsh", "cortisol", "prolactin", "hcg", "testosterone", "estradiol", "pth", "acth", "insulin",
           "growth_hormone", "troponin", "bnp", "ck_mb", "d_dimer", "crp", "esr", "procalcitonin", "cea",
           "ca_125", "ca_19_9", "psa", "afp", "lithium", "digoxin", "acetaminophen", "salicylate",
           "ethanol", "influenza", "covid_19", "streptococcus", "hiv", "hepatitis_b", "hepatitis_c", "ebv",
           "lyme", "tuberculosis", "ana", "anca", "anti_dsdna", "hba1c", "glucose", "lipase", "amylase",
           "lactate", "ammonia", "b12", "folate", "ferritin", "brca", "karyotype", "cftr")
# fmt: on

PARAMETER_VALUES: dict[str, tuple[str, ...]] = {
    "region": REGIONS,
    "contrast": ("yes", "no"),
    "source": SOURCES,
    "site": SITES,
    "type": TYPES,
    "target": TARGETS,
}
PARAMETERS = tuple(PARAMETER_VALUES)
TIERS = {1: "low", 2: "medium", 3: "high"}
# A parameter left out takes this value where the exam has it (a CT is non-contrast unless asked for).
DEFAULTS = {"contrast": "no"}


@dataclass(frozen=True)
class Exam:
    name: str
    label: str
    group: str
    cost: int  # 1 low, 2 medium, 3 high
    discomfort: int
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    values: dict[str, tuple[str, ...]] = field(default_factory=dict)  # narrower vocabularies, per parameter

    @property
    def parameters(self) -> tuple[str, ...]:
        return self.required + self.optional

    def tiers(self) -> str:
        """'cost medium, discomfort high': how a prompt and a result name the exam's burden."""
        return f"cost {TIERS[self.cost]}, discomfort {TIERS[self.discomfort]}"

    @property
    def charge(self) -> int:
        """cost + discomfort: 2 (an X-ray, a blood count) to 6 (a biopsy, a lumbar puncture)."""
        return self.cost + self.discomfort

    def allowed(self, parameter: str) -> tuple[str, ...]:
        return self.values.get(parameter, PARAMETER_VALUES[parameter])


def _e(name: str, label: str, group: str, cost: int, discomfort: int, required=(), optional=(), **values):
    return Exam(name, label, group, cost, discomfort, tuple(required), tuple(optional), values)


_IMAGING_REGIONS = (
    "head",
    "neck",
    "chest",
    "abdomen",
    "pelvis",
    "spine",
    "upper_extremity",
    "lower_extremity",
    "whole_body",
)
# One entry per line: the table is easier to read and to diff that way.
# fmt: off
EXAMS: dict[str, Exam] = {e.name: e for e in (
    # imaging
    _e("xray", "X-ray", "imaging", 1, 1, ["region"], region=_IMAGING_REGIONS),
    _e("ct", "CT scan", "imaging", 2, 2, ["region"], ["contrast"], region=_IMAGING_REGIONS),
    _e("mri", "MRI", "imaging", 3, 2, ["region"], ["contrast"], region=_IMAGING_REGIONS),
    _e("ultrasound", "ultrasound", "imaging", 1, 1, ["region"], ["type"],
       region=(*_IMAGING_REGIONS, "heart", "breast", "kidney", "liver"), type=("routine", "doppler")),
    _e("pet_scan", "PET scan", "imaging", 3, 2, ["region"], region=_IMAGING_REGIONS),
    _e("nuclear_scan", "nuclear medicine scan", "imaging", 3, 2, ["type"],
       type=("ventilation_perfusion", "bone_scan", "thyroid_scan", "hida", "gallium")),
    _e("angiography", "angiography", "imaging", 3, 3, ["type"],
       type=("ct_angiography", "coronary", "pulmonary", "cerebral")),
    _e("fluoroscopy", "fluoroscopy", "imaging", 2, 2, ["region"], region=_IMAGING_REGIONS),
    _e("mammography", "mammography", "imaging", 1, 2),
    _e("dexa_scan", "DEXA scan", "imaging", 1, 1),
    # cardiac
    _e("ecg", "ECG", "cardiac", 1, 1),
    _e("echocardiogram", "echocardiogram", "cardiac", 2, 1, optional=["type"],
       type=("transthoracic", "transesophageal")),
    _e("holter_monitor", "Holter monitor", "cardiac", 2, 1),
    _e("stress_test", "stress test", "cardiac", 2, 2, ["type"], type=("exercise", "pharmacologic")),
    _e("cardiac_catheterization", "cardiac catheterization", "cardiac", 3, 3),
    # blood
    _e("cbc", "complete blood count", "blood", 1, 1),
    _e("bmp", "basic metabolic panel", "blood", 1, 1),
    _e("cmp", "comprehensive metabolic panel", "blood", 1, 1),
    _e("lipid_panel", "lipid panel", "blood", 1, 1),
    _e("liver_function_test", "liver function tests", "blood", 1, 1),
    _e("renal_function_test", "renal function tests", "blood", 1, 1),
    _e("thyroid_function_test", "thyroid function tests", "blood", 1, 1),
    _e("coagulation_panel", "coagulation panel", "blood", 1, 1),
    _e("iron_studies", "iron studies", "blood", 1, 1),
    _e("blood_gas", "arterial blood gas", "blood", 1, 2),
    _e("inflammatory_markers", "inflammatory markers", "blood", 1, 1, optional=["target"],
       target=("crp", "esr", "procalcitonin")),
    _e("cardiac_markers", "cardiac markers", "blood", 1, 1, optional=["target"],
       target=("troponin", "bnp", "ck_mb", "d_dimer")),
    _e("tumor_markers", "tumour markers", "blood", 2, 1, ["target"],
       target=("cea", "ca_125", "ca_19_9", "psa", "afp")),
    _e("hormone_level", "hormone level", "blood", 2, 1, ["target"],
       target=("tsh", "cortisol", "prolactin", "hcg", "testosterone", "estradiol", "pth", "acth", "insulin",
               "growth_hormone")),
    _e("drug_level", "drug level", "blood", 1, 1, ["target"],
       target=("lithium", "digoxin", "acetaminophen", "salicylate", "ethanol")),
    _e("blood_test", "blood test", "blood", 1, 1, ["target"],
       target=("hba1c", "glucose", "lipase", "amylase", "lactate", "ammonia", "b12", "folate", "ferritin",
               "d_dimer")),
    # microbiology
    _e("culture", "culture", "microbiology", 1, 1, ["source"]),
    _e("serology", "serology", "microbiology", 2, 1, ["target"],
       target=("hiv", "hepatitis_b", "hepatitis_c", "ebv", "lyme", "ana", "anca", "anti_dsdna",
               "streptococcus")),
    _e("pcr_test", "PCR test", "microbiology", 2, 1, ["target"],
       target=("influenza", "covid_19", "streptococcus", "tuberculosis", "hiv")),
    _e("viral_load", "viral load", "microbiology", 2, 1, ["target"], target=("hiv", "hepatitis_b", "hepatitis_c")),
    # urine and stool
    _e("urinalysis", "urinalysis", "urine", 1, 1),
    _e("urine_test", "urine test", "urine", 1, 1, optional=["target"], target=("hcg", "ethanol", "cortisol")),
    _e("urine_cytology", "urine cytology", "urine", 1, 1),
    _e("stool_test", "stool test", "stool", 1, 2),
    _e("csf_analysis", "CSF analysis", "fluid", 2, 3),
    # pathology
    _e("biopsy", "biopsy", "pathology", 3, 3, ["site"]),
    _e("histopathology", "histopathology", "pathology", 2, 2, ["site"]),
    _e("cytology", "cytology", "pathology", 2, 2, ["site"]),
    _e("immunohistochemistry", "immunohistochemistry", "pathology", 2, 1, ["site"]),
    _e("flow_cytometry", "flow cytometry", "pathology", 2, 1, optional=["source"], source=("blood", "bone_marrow")),
    # procedures
    _e("lumbar_puncture", "lumbar puncture", "procedure", 3, 3),
    _e("paracentesis", "paracentesis", "procedure", 3, 3),
    _e("thoracentesis", "thoracentesis", "procedure", 3, 3),
    _e("arthrocentesis", "arthrocentesis", "procedure", 2, 3),
    _e("bone_marrow_biopsy", "bone marrow biopsy", "procedure", 3, 3),
    _e("endoscopy", "endoscopy", "procedure", 3, 2, ["type"],
       type=("egd", "colonoscopy", "bronchoscopy", "sigmoidoscopy", "cystoscopy", "laryngoscopy", "ercp",
             "capsule")),
    _e("amniocentesis", "amniocentesis", "procedure", 3, 3),
    _e("hysterosalpingogram", "hysterosalpingogram", "procedure", 2, 3),
    # neuro, lung and others
    _e("eeg", "EEG", "neuro", 2, 1),
    _e("emg", "EMG and nerve conduction", "neuro", 2, 2),
    _e("evoked_potentials", "evoked potentials", "neuro", 2, 1),
    _e("pulmonary_function_test", "pulmonary function tests", "pulmonary", 1, 1),
    _e("genetic_test", "genetic test", "genetic", 3, 1, optional=["target"], target=("brca", "karyotype", "cftr")),
    _e("molecular_test", "molecular test", "genetic", 3, 1, optional=["source"], source=("blood", "tissue")),
    _e("eye_exam", "eye examination", "other", 1, 1),
    _e("audiometry", "audiometry", "other", 2, 2),
    _e("physical_examination", "physical examination", "other", 1, 1, optional=["region"],
       region=_IMAGING_REGIONS),
    _e("skin_test", "skin test", "other", 1, 2, optional=["target"], target=("tuberculosis",)),
    _e("allergy_test", "allergy test", "other", 1, 2),
    _e("rheumatoid_factor", "rheumatoid factor", "blood", 1, 1),
)}
# fmt: on

# Spellings in source tables that name a catalogue exam (MedExAgent uses both echo names).
ALIASES = {
    "echocardiography": "echocardiogram",
    "x_ray": "xray",
    "x-ray": "xray",
    "mri_scan": "mri",
    "ct_scan": "ct",
    "ekg": "ecg",
    "electrocardiogram": "ecg",
    "us": "ultrasound",
}


class ExamError(ValueError):
    """An exam that the catalogue cannot express: unknown name, parameter or value."""


@dataclass(frozen=True, order=True)
class ExamCall:
    """One fully specified exam: its name and every parameter it has, defaults filled in."""

    name: str
    params: tuple[tuple[str, str], ...] = ()

    @property
    def exam(self) -> Exam:
        return EXAMS[self.name]

    def key(self) -> str:
        """The canonical spelling, as in MedExAgent's tables: ct(contrast="yes", region="chest")."""
        inner = ", ".join(f'{k}="{v}"' for k, v in self.params)
        return f"{self.name}({inner})"

    def describe(self) -> str:
        """Readable: 'CT scan (region chest, contrast yes)'."""
        if not self.params:
            return self.exam.label
        parts = ", ".join(f"{k} {v.replace('_', ' ')}" for k, v in self.params)
        return f"{self.exam.label} ({parts})"

    def as_arguments(self) -> dict[str, str]:
        return {"exam": self.name, **dict(self.params)}


@dataclass(frozen=True)
class RecordedExam:
    """An exam of a case's work-up and what it found."""

    call: ExamCall
    findings: str


def exam_call(name: str, params: dict[str, str | None]) -> ExamCall:
    """Validate and canonicalise one exam; raises ExamError naming what is wrong and what is allowed."""
    name = ALIASES.get(name.strip().lower(), name.strip().lower())
    exam = EXAMS.get(name)
    if exam is None:
        raise ExamError(f"unknown exam {name!r}")
    given = {k: str(v).strip().lower() for k, v in params.items() if v is not None and str(v).strip() != ""}
    extra = sorted(set(given) - set(exam.parameters))
    if extra:
        takes = ", ".join(exam.parameters) or "no parameters"
        raise ExamError(f"{name} does not take {', '.join(extra)} (it takes {takes})")
    missing = [p for p in exam.required if p not in given]
    if missing:
        raise ExamError(f"{name} needs {', '.join(missing)} (one of {', '.join(exam.allowed(missing[0]))})")
    for parameter in exam.optional:
        if parameter not in given and parameter in DEFAULTS:
            given[parameter] = DEFAULTS[parameter]
    for parameter, value in given.items():
        if value not in exam.allowed(parameter):
            raise ExamError(
                f"{name} {parameter} must be one of {', '.join(exam.allowed(parameter))}, not {value!r}"
            )
    return ExamCall(name, tuple(sorted(given.items())))


_CALL = re.compile(r"^\s*([A-Za-z_][\w-]*)\s*\((.*)\)\s*$", re.DOTALL)
_ARGUMENT = re.compile(r"""\s*(\w+)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^,]*?))\s*(?:,|$)""")


def parse_exam_string(text: str) -> ExamCall:
    """`ct(region="chest", contrast="yes")` → ExamCall; a bare name (`cbc`) is a call without parameters."""
    text = (text or "").strip()
    match = _CALL.match(text)
    if match is None:
        if re.fullmatch(r"[A-Za-z_][\w-]*", text):
            return exam_call(text, {})
        raise ExamError(f"not an exam call: {text[:80]!r}")
    name, inner = match.groups()
    params: dict[str, str | None] = {}
    position = 0
    inner = inner.strip()
    while position < len(inner):
        arg = _ARGUMENT.match(inner, position)
        if arg is None or arg.end() == position:
            raise ExamError(f"cannot read the arguments of {text[:80]!r}")
        key, *values = arg.groups()
        params[key] = next(v for v in values if v is not None)
        position = arg.end()
    return exam_call(name, params)


def catalogue_text() -> str:
    """The exam list a clinician prompt shows: name, parameters (values where an exam narrows them), tiers."""
    lines = []
    for exam in EXAMS.values():
        params = []
        for p in exam.parameters:
            narrowed = exam.values.get(p)
            spelled = f"{p}: {'|'.join(narrowed)}" if narrowed and len(narrowed) <= 12 else p
            params.append(spelled + ("" if p in exam.required else "?"))
        lines.append(f"- {exam.name}({', '.join(params)}): {exam.label}; {exam.tiers()}")
    return "\n".join(lines)
