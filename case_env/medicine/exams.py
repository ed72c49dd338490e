"""The exam vocabulary: MedExAgent's 67 exam tools, their parameters and allowed values, their cost and
discomfort tiers, and the sentence each result is told in.

Everything in the table below is carried over from MedExAgent (`EndlessCG/medexagent`, `data/tool.py`:
`TOOL_SCHEMAS`, `TOOL_PARAM_VALUES`, `_FINDINGS_TEMPLATES`; `train/rl/reward.py`: `EXAM_COST`; docs/sources.md,
MedExAgent), so its case tables and its released model's calls are understood unchanged: the tool names, each
parameter's description, which parameters are required, the allowed values where MedExAgent gives them (a
parameter without allowed values takes free text), the (cost, discomfort) tiers (Low 1, Medium 2, High 3;
`audiometry` has no entry there and takes the default (2, 2)) and the result sentences. The one-word labels
and the groups are ours, for prompts and reports.

An exam is matched the way MedExAgent's executor matches it: its name and the set of (parameter, value)
pairs given, values compared lower-cased and stripped, so `ct(region="chest")` and
`ct(region="chest", contrast="no")` are different exams. There is no fallback by name: a wrong region never
returns another region's findings (MedExAgent's executor does fall back when a name occurs once).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from case_env.core.control import excerpt

MAX_EXAM_SCORE = 6  # the highest cost + discomfort of one exam (MedExAgent `_MAX_EXAM_SCORE`)
DEFAULT_TIERS = (2, 2)  # an exam without an EXAM_COST entry (MedExAgent `EXAM_COST.get(name, (2, 2))`)
TIERS = {1: "low", 2: "medium", 3: "high"}

# fmt: off
_IMAGING = ("head", "neck", "chest", "abdomen", "pelvis", "spine", "upper_extremity", "lower_extremity",
            "whole_body")
_ULTRASOUND = (*_IMAGING, "thyroid", "breast", "cardiac", "obstetric", "vascular", "musculoskeletal", "scrotal")
_YES_NO = ("yes", "no")
_ECHO = ("transthoracic", "transesophageal", "stress", "fetal")
# fmt: on


@dataclass(frozen=True)
class Parameter:
    description: str
    values: tuple[str, ...] | None = None  # None: free text


@dataclass(frozen=True)
class Exam:
    name: str
    label: str
    group: str
    description: str
    cost: int  # 1 low, 2 medium, 3 high
    discomfort: int
    template: str  # the result sentence, with {findings} and the exam's parameters
    parameters: dict[str, Parameter] = field(default_factory=dict)
    required: tuple[str, ...] = ()

    @property
    def charge(self) -> int:
        """cost + discomfort: 2 (an X-ray, a blood count) to 6 (a biopsy, a lumbar puncture)."""
        return self.cost + self.discomfort

    def tiers(self) -> str:
        """'cost medium, discomfort high': how a prompt names the exam's burden."""
        return f"cost {TIERS[self.cost]}, discomfort {TIERS[self.discomfort]}"

    def allowed(self, parameter: str) -> tuple[str, ...] | None:
        return self.parameters[parameter].values


def _e(name, label, group, tiers, summary, template, required=(), **parameters) -> Exam:
    params = {
        p: Parameter(spec[0], tuple(spec[1]) if len(spec) > 1 else None) for p, spec in parameters.items()
    }
    return Exam(name, label, group, summary, *tiers, template, params, tuple(required))


# One exam per entry, in MedExAgent's order: (description, allowed values) per parameter.
# fmt: off
EXAMS: dict[str, Exam] = {e.name: e for e in (
    _e("xray", "X-ray", "imaging", (1, 1), "Order an X-ray imaging study.",
       "The {region} X-ray reveals: {findings}", ["region"],
       region=("Body region to image (e.g. chest, abdomen, knee)", _IMAGING)),
    _e("ct", "CT scan", "imaging", (3, 1), "Order a CT (computed tomography) scan.",
       "The CT scan of the {region} shows: {findings}", ["region"],
       region=("Body region to scan", _IMAGING), contrast=("Contrast usage (with contrast, no, yes)", _YES_NO)),
    _e("mri", "MRI", "imaging", (3, 2), "Order an MRI (magnetic resonance imaging) scan.",
       "The MRI of the {region} shows: {findings}", ["region"],
       region=("Body region to scan", _IMAGING), contrast=("Contrast usage", _YES_NO)),
    _e("ultrasound", "ultrasound", "imaging", (2, 1), "Order an ultrasound examination.",
       "The ultrasound of the {region} shows: {findings}", ["region"],
       region=("Body region to examine", _ULTRASOUND)),
    _e("blood_test", "blood test", "blood", (1, 1), "Order a blood test / laboratory panel.",
       "The {test} results: {findings}", ["test"],
       test=("Specific test name", ("general_laboratory_panel", "coombs_test", "ana", "anca", "hba1c", "ldh",
             "uric_acid", "amylase", "lipase", "complement_levels", "immunoglobulin_levels", "vitamin_b12",
             "folate", "hemoglobin_electrophoresis", "blood_type", "glucose_tolerance_test",
             "reticulocyte_count", "direct_antiglobulin_test", "indirect_antiglobulin_test",
             "protein_electrophoresis", "anti_dsdna", "anti_smith", "anti_ccp", "anti_gliadin", "anti_tpo",
             "beta_2_microglobulin", "haptoglobin", "ammonia"))),
    _e("cbc", "complete blood count", "blood", (1, 1), "Order a complete blood count.",
       "The complete blood count results: {findings}",
       type=("Specific CBC variant (e.g. peripheral smear, differential)",
             ("cbc", "cbc_with_differential", "peripheral_smear"))),
    _e("bmp", "basic metabolic panel", "blood", (1, 1), "Order a basic metabolic panel.",
       "The basic metabolic panel results: {findings}"),
    _e("cmp", "comprehensive metabolic panel", "blood", (1, 1), "Order a comprehensive metabolic panel.",
       "The comprehensive metabolic panel results: {findings}"),
    _e("lipid_panel", "lipid panel", "blood", (1, 1), "Order a lipid panel.",
       "The lipid panel results: {findings}"),
    _e("liver_function_test", "liver function tests", "blood", (1, 1), "Order liver function tests.",
       "The liver function test results: {findings}"),
    _e("renal_function_test", "renal function tests", "blood", (1, 1), "Order renal function tests.",
       "The renal function test results: {findings}"),
    _e("thyroid_function_test", "thyroid function tests", "blood", (1, 1), "Order thyroid function tests.",
       "The thyroid function test results: {findings}"),
    _e("coagulation_panel", "coagulation panel", "blood", (1, 1), "Order coagulation studies.",
       "The coagulation study results: {findings}",
       type=("Specific coagulation test", ("pt_inr", "aptt", "d_dimer", "fibrinogen", "full_panel"))),
    _e("iron_studies", "iron studies", "blood", (1, 1), "Order iron studies.",
       "The iron studies results: {findings}"),
    _e("inflammatory_marker", "inflammatory markers", "blood", (1, 1),
       "Order inflammatory markers (CRP, ESR, etc.).", "The inflammatory marker results: {findings}",
       marker=("Specific marker name", ("crp", "esr", "procalcitonin", "ferritin"))),
    _e("cardiac_enzyme", "cardiac enzymes", "blood", (1, 1), "Order cardiac enzyme / biomarker tests.",
       "The cardiac enzyme results: {findings}",
       marker=("Specific cardiac marker", ("troponin", "ck_mb", "bnp", "nt_probnp", "myoglobin"))),
    _e("tumor_marker", "tumour markers", "blood", (2, 1), "Order tumor marker tests.",
       "The tumor marker results: {findings}",
       marker=("Specific tumor marker", ("cea", "afp", "ca_125", "ca_19_9", "psa", "beta_hcg", "ldh", "ca_15_3",
               "chromogranin_a", "nse"))),
    _e("hormone_level", "hormone level", "blood", (2, 1), "Order hormone level tests.",
       "The {hormone} level results: {findings}", ["hormone"],
       hormone=("Hormone to measure", ("cortisol", "acth", "growth_hormone", "igf_1", "insulin", "estrogen",
                "progesterone", "testosterone", "pth", "prolactin", "aldosterone", "renin", "catecholamines",
                "tsh", "fsh", "lh", "dhea_s", "vitamin_d"))),
    _e("drug_level", "drug level", "blood", (2, 1), "Order drug level / therapeutic drug monitoring.",
       "The {drug} drug level results: {findings}", ["drug"],
       drug=("Drug to measure", ("vancomycin", "gentamicin", "digoxin", "lithium", "phenytoin", "valproic_acid",
             "carbamazepine", "theophylline", "methotrexate", "cyclosporine", "tacrolimus", "warfarin",
             "toxicology_screen"))),
    _e("blood_gas", "blood gas", "blood", (2, 2), "Order arterial or venous blood gas analysis.",
       "The blood gas analysis results: {findings}", type=("arterial or venous", ("arterial", "venous"))),
    _e("ecg", "ECG", "cardiac", (1, 1), "Order an electrocardiogram.", "The ECG shows: {findings}",
       type=("ECG type (e.g. standard 12-lead, surface)", ("standard_12_lead", "rhythm_strip", "signal_averaged"))),
    _e("echocardiogram", "echocardiogram", "cardiac", (2, 1), "Order an echocardiogram.",
       "The echocardiogram shows: {findings}",
       type=("Echo type (transthoracic/TTE, transesophageal/TEE, etc.)", _ECHO),
       contrast=("Whether contrast is used", _YES_NO)),
    _e("echocardiography", "echocardiography", "cardiac", (2, 1), "Order echocardiography (alias).",
       "The echocardiography shows: {findings}", type=("Echo type", _ECHO), region=("Region", _IMAGING)),
    _e("holter_monitor", "Holter monitor", "cardiac", (2, 1), "Order Holter / ambulatory ECG monitoring.",
       "The Holter monitor results: {findings}",
       duration=("Monitoring duration (e.g. 24h)", ("24h", "48h", "72h", "7d", "14d", "30d"))),
    _e("stress_test", "stress test", "cardiac", (2, 2), "Order a cardiac or orthopedic stress test.",
       "The stress test results: {findings}",
       type=("Stress test type", ("exercise", "pharmacologic", "nuclear"))),
    _e("cardiac_catheterization", "cardiac catheterisation", "cardiac", (3, 3),
       "Order cardiac catheterization / coronary angiography.", "The cardiac catheterization shows: {findings}",
       type=("Type (left heart, right heart, both, coronary angiography)",
             ("left_heart", "right_heart", "both", "coronary_angiography"))),
    _e("eeg", "EEG", "neuro", (2, 1), "Order an electroencephalogram.", "The EEG shows: {findings}",
       type=("EEG type (e.g. video, quantitative)",
             ("routine", "continuous", "video", "sleep_deprived", "ambulatory"))),
    _e("emg", "EMG and nerve conduction", "neuro", (2, 2), "Order electromyography / nerve conduction studies.",
       "The EMG/nerve conduction study shows: {findings}",
       region=("Body region / nerves to test",
               ("upper_extremity", "lower_extremity", "facial", "paraspinal", "whole_body"))),
    _e("evoked_potentials", "evoked potentials", "neuro", (2, 1), "Order evoked potential studies.",
       "The evoked potentials study shows: {findings}",
       type=("Type (visual, auditory, somatosensory)", ("visual", "auditory", "somatosensory")), site=("Site",)),
    _e("pulmonary_function_test", "pulmonary function tests", "pulmonary", (2, 1),
       "Order pulmonary function tests.", "The pulmonary function test results: {findings}",
       type=("Specific PFT type",
             ("spirometry", "full_pft", "dlco", "methacholine_challenge", "bronchoprovocation"))),
    _e("endoscopy", "endoscopy", "procedure", (3, 2), "Order an endoscopic procedure.",
       "The endoscopy reveals: {findings}",
       type=("Endoscopy type (e.g. upper GI, colonoscopy, bronchoscopy)",
             ("egd", "colonoscopy", "bronchoscopy", "cystoscopy", "sigmoidoscopy", "ercp", "eus", "laryngoscopy",
              "capsule_endoscopy", "rhinoscopy", "arthroscopy", "hysteroscopy", "colposcopy", "enteroscopy")),
       region=("Body region",)),
    _e("biopsy", "biopsy", "pathology", (3, 3), "Order a tissue biopsy.", "The biopsy of {site} shows: {findings}",
       ["site"],
       site=("Biopsy site", ("skin", "liver", "kidney", "lung", "lymph_node", "breast", "thyroid",
             "gastrointestinal", "brain", "bone", "soft_tissue", "prostate", "cervix", "endometrium", "muscle",
             "nerve", "pleura", "peritoneum", "bone_marrow", "salivary_gland", "adrenal", "bladder", "pancreas",
             "spleen", "testis")),
       type=("Biopsy type (e.g. core, fine needle, excisional)",
             ("excisional", "incisional", "core_needle", "fine_needle", "punch", "shave", "open")),
       method=("Guidance method (e.g. CT-guided)",)),
    _e("bone_marrow_biopsy", "bone marrow biopsy", "procedure", (3, 3), "Order a bone marrow biopsy / aspiration.",
       "The bone marrow biopsy shows: {findings}",
       type=("Type (aspiration, biopsy, both)", ("aspiration", "biopsy", "both"))),
    _e("lumbar_puncture", "lumbar puncture", "procedure", (3, 3), "Order a lumbar puncture / CSF analysis.",
       "The lumbar puncture results: {findings}"),
    _e("csf_analysis", "CSF analysis", "fluid", (2, 3), "Order cerebrospinal fluid analysis.",
       "The CSF analysis results: {findings}"),
    _e("arthrocentesis", "joint aspiration", "procedure", (2, 2), "Order joint aspiration / arthrocentesis.",
       "The joint aspiration of {joint} shows: {findings}", ["joint"],
       joint=("Joint to aspirate",
              ("knee", "shoulder", "hip", "ankle", "wrist", "elbow", "finger", "toe", "sacroiliac"))),
    _e("paracentesis", "paracentesis", "procedure", (3, 3), "Order abdominal paracentesis.",
       "The paracentesis fluid analysis shows: {findings}"),
    _e("thoracentesis", "thoracentesis", "procedure", (3, 3), "Order thoracentesis / pleural tap.",
       "The thoracentesis fluid analysis shows: {findings}"),
    _e("amniocentesis", "amniocentesis", "procedure", (3, 3), "Order amniocentesis.",
       "The amniocentesis results: {findings}"),
    _e("culture", "culture", "microbiology", (2, 1), "Order a microbiological culture.",
       "The culture from {source} shows: {findings}", ["source"],
       source=("Culture source / specimen type", ("blood", "urine", "sputum", "wound", "csf", "stool", "throat",
               "tissue", "abscess", "peritoneal_fluid", "pleural_fluid", "joint_fluid", "bronchoalveolar_lavage",
               "catheter_tip"))),
    _e("serology", "serology", "microbiology", (2, 1), "Order serological tests.",
       "The {test} serology results: {findings}", ["test"],
       test=("Specific serological test", ("hepatitis_a", "hepatitis_b", "hepatitis_c", "hiv", "syphilis", "ebv",
             "cmv", "lyme", "autoimmune_panel", "toxoplasma", "rubella", "hsv", "varicella", "measles", "brucella",
             "dengue", "rickettsia", "aspergillus", "cryptococcus", "coxsackievirus"))),
    _e("pcr_test", "PCR test", "microbiology", (2, 1), "Order a PCR-based test.",
       "The PCR test for {target} results: {findings}", ["target"],
       target=("PCR target (pathogen, gene, etc.)", ("hiv", "hepatitis_b", "hepatitis_c", "cmv", "ebv", "hsv",
               "tuberculosis", "covid_19", "influenza", "mrsa", "clostridium_difficile", "hpv"))),
    _e("viral_load", "viral load", "microbiology", (2, 1), "Order a viral load test.",
       "The viral load test results: {findings}",
       test=("Viral load test type", ("hiv", "hepatitis_b", "hepatitis_c", "cmv", "ebv"))),
    _e("genetic_test", "genetic test", "genetic", (3, 1), "Order a genetic / molecular genetic test.",
       "The genetic test ({test}) results: {findings}", ["test"],
       test=("Specific genetic test", ("karyotyping", "fish", "gene_sequencing", "chromosomal_microarray",
             "mutation_analysis", "whole_exome_sequencing", "pcr_based", "methylation_analysis",
             "linkage_analysis"))),
    _e("molecular_test", "molecular test", "genetic", (3, 1), "Order a molecular test.",
       "The molecular test results: {findings}", ["test"],
       test=("Specific molecular test",
             ("fish", "pcr", "sequencing", "microarray", "methylation", "gene_expression", "mutation_panel"))),
    _e("histopathology", "histopathology", "pathology", (2, 1), "Order histopathological examination.",
       "The histopathology of {specimen} shows: {findings}", ["specimen"],
       specimen=("Specimen to examine", ("surgical_resection", "biopsy_specimen", "excised_lesion", "polyp",
                 "tumor", "appendix", "gallbladder", "lymph_node", "skin", "bone", "soft_tissue"))),
    _e("immunohistochemistry", "immunohistochemistry", "pathology", (2, 1), "Order immunohistochemistry staining.",
       "The immunohistochemistry results: {findings}",
       markers=("Markers to test", ("ki_67", "her2", "er_pr", "cd20", "cd3", "cd45", "ck7", "ck20", "ttf1", "p63",
                "s100", "sma", "desmin", "vimentin", "synaptophysin", "chromogranin", "multiple", "other"))),
    _e("cytology", "cytology", "pathology", (2, 2), "Order cytological examination.",
       "The cytology results: {findings}",
       site=("Site / specimen", ("cervix", "thyroid", "breast", "lung", "lymph_node", "pleural_fluid",
             "peritoneal_fluid", "csf")),
       type=("Cytology type", ("pap_smear", "fnac", "fluid_cytology", "brushing", "wash"))),
    _e("flow_cytometry", "flow cytometry", "pathology", (2, 1), "Order flow cytometry analysis.",
       "The flow cytometry results: {findings}",
       specimen=("Specimen type", ("blood", "bone_marrow", "tissue", "csf", "pleural_fluid"))),
    _e("urinalysis", "urinalysis", "urine", (1, 1), "Order a urinalysis.", "The urinalysis results: {findings}",
       type=("Urinalysis type", ("dipstick", "microscopy", "full_urinalysis"))),
    _e("urine_test", "urine test", "urine", (1, 1), "Order a urine test.",
       "The urine test ({test}) results: {findings}", ["test"],
       test=("Specific urine test", ("24h_urine_protein", "24h_urine_creatinine", "urine_electrolytes",
             "urine_osmolality", "urine_drug_screen", "urine_catecholamines", "urine_cortisol",
             "urine_porphyrins", "urine_organic_acids", "urine_amino_acids"))),
    _e("urine_cytology", "urine cytology", "urine", (2, 1), "Order urine cytology.",
       "The urine cytology results: {findings}", type=("Cytology type", ("voided", "catheterized"))),
    _e("stool_test", "stool test", "stool", (1, 1), "Order a stool test.", "The stool test results: {findings}",
       ["test"],
       test=("Specific stool test", ("occult_blood", "ova_and_parasites", "calprotectin", "elastase", "fat",
             "clostridium_difficile_toxin", "giardia_antigen", "reducing_substances"))),
    _e("pet_scan", "PET scan", "imaging", (3, 1), "Order a PET (positron emission tomography) scan.",
       "The PET scan shows: {findings}",
       region=("Body region", _IMAGING),
       tracer=("Radiotracer (e.g. FDG)", ("fdg", "gallium_68", "florbetapir", "choline", "psma"))),
    _e("nuclear_scan", "nuclear medicine scan", "imaging", (3, 2), "Order a nuclear medicine scan.",
       "The nuclear scan shows: {findings}",
       type=("Scan type (e.g. bone scan, thyroid scan)", ("bone_scan", "thyroid_scan", "renal_scan", "hida",
             "vq_scan", "mibg", "gallium_scan", "parathyroid_scan", "cardiac_perfusion", "octreotide_scan",
             "white_blood_cell_scan")),
       region=("Body region", _IMAGING)),
    _e("mammography", "mammography", "imaging", (1, 2), "Order a mammogram.", "The mammography shows: {findings}",
       type=("Mammography type (screening, diagnostic)", ("screening", "diagnostic"))),
    _e("dexa_scan", "DEXA scan", "imaging", (1, 1), "Order a DEXA bone density scan.",
       "The DEXA scan results: {findings}",
       region=("Region to scan", ("hip", "spine", "whole_body", "forearm"))),
    _e("fluoroscopy", "fluoroscopy", "imaging", (2, 2), "Order a fluoroscopic study.",
       "The fluoroscopic study shows: {findings}", ["type"],
       type=("Fluoroscopy type / study name", ("barium_swallow", "barium_enema", "upper_gi_series",
             "voiding_cystourethrogram", "intravenous_pyelogram", "contrast_enema", "esophagram",
             "small_bowel_follow_through"))),
    _e("angiography", "angiography", "imaging", (3, 3), "Order an angiography study.",
       "The angiography of {region} shows: {findings}", ["region"],
       region=("Vascular region", ("coronary", "cerebral", "pulmonary", "aortic", "peripheral", "renal",
               "mesenteric", "carotid")),
       type=("Angiography type (e.g. digital subtraction, CT angiography)",
             ("conventional", "ct_angiography", "mr_angiography", "digital_subtraction"))),
    _e("eye_exam", "eye examination", "eye", (1, 1), "Order an ophthalmological examination.",
       "The eye examination shows: {findings}",
       type=("Exam type (e.g. fundoscopy, slit-lamp, OCT)", ("fundoscopy", "slit_lamp", "tonometry",
             "visual_acuity", "visual_field", "oct", "fluorescein_angiography", "gonioscopy", "color_vision",
             "refraction")),
       region=("Eye region",)),
    _e("audiometry", "audiometry", "other", DEFAULT_TIERS, "Order an audiometric / hearing evaluation.",
       "The {exam_name} results: {findings}",
       type=("Audiometry variant", ("pure_tone", "tympanometry", "oae", "abr", "full_battery"))),
    _e("physical_examination", "physical examination", "other", (1, 1), "Order a focused physical examination.",
       "The physical examination reveals: {findings}",
       type=("Examination type", ("general", "neurological", "cardiovascular", "respiratory", "abdominal",
             "musculoskeletal", "dermatological", "ophthalmologic", "ent", "rectal", "breast", "genitourinary",
             "vital_signs", "psychiatric")),
       region=("Body region to examine",)),
    _e("allergy_test", "allergy test", "other", (2, 1), "Order allergy testing.",
       "The allergy testing results: {findings}",
       type=("Test type (skin prick, RAST, specific IgE)", ("skin_prick", "rast", "specific_ige", "patch_test")),
       allergens=("Allergens to test",)),
    _e("skin_test", "skin test", "other", (1, 1), "Order a skin test.", "The skin test results: {findings}",
       type=("Test type (patch testing, tuberculin, etc.)", ("tuberculin", "patch_test", "prick_test", "koh_prep",
             "woods_lamp", "dermoscopy", "skin_scraping", "tzanck_smear")),
       allergens=("Allergens / substances to test",)),
    _e("rheumatoid_factor", "rheumatoid factor", "blood", (1, 1), "Order rheumatoid factor test.",
       "The rheumatoid factor test results: {findings}"),
    _e("hysterosalpingogram", "hysterosalpingogram", "procedure", (2, 2), "Order a hysterosalpingogram.",
       "The hysterosalpingogram shows: {findings}"),
    _e("other", "other examination", "other", (2, 2),
       "Order another examination or test not covered by specific categories.",
       "The {description} results: {findings}", ["description"],
       description=("Description of the exam/test",)),
)}
# fmt: on

# MedExAgent never offers `other` to a case (select_tools_for_case skips it) and drops rows that need it.
NOT_OFFERED = frozenset({"other"})
# The positional form MedExAgent's parser accepts, `blood_gas(arterial)`: the parameter it stands for.
_POSITIONAL = {"blood_gas": "type"}
FREE_TEXT_MAX = 200


class ExamError(ValueError):
    """An exam that the vocabulary cannot express: unknown name, parameter or value."""


@dataclass(frozen=True, order=True)
class ExamCall:
    """One exam as ordered: its name and the (parameter, value) pairs given, lower-cased, sorted by name."""

    name: str
    params: tuple[tuple[str, str], ...] = ()

    @property
    def exam(self) -> Exam:
        return EXAMS[self.name]

    def key(self) -> str:
        """The canonical spelling, as MedExAgent's tables write it: ct(contrast="yes", region="chest")."""
        inner = ", ".join(f'{k}="{v}"' for k, v in self.params)
        return f"{self.name}({inner})"

    def describe(self) -> str:
        """Readable: 'CT scan (region chest, contrast yes)'."""
        if not self.params:
            return self.exam.label
        parts = ", ".join(f"{k} {v.replace('_', ' ')}" for k, v in self.params)
        return f"{self.exam.label} ({parts})"

    def as_arguments(self) -> dict[str, str]:
        return dict(self.params)


@dataclass(frozen=True)
class RecordedExam:
    """An exam of a case's work-up, as recorded (`spelled`, MedExAgent's string), and what it found."""

    call: ExamCall
    findings: str
    spelled: str = ""


def _normal(value: object) -> str:
    return str(value).strip().lower()


def exam_call(name: str, params: dict[str, object | None]) -> ExamCall:
    """Validate and canonicalise one exam; raises ExamError naming what is wrong and what is allowed."""
    name = _normal(name)
    exam = EXAMS.get(name)
    if exam is None:
        raise ExamError(f"unknown exam {excerpt(name)}")
    given = {k: _normal(v) for k, v in params.items() if v is not None and _normal(v) != ""}
    extra = sorted(set(given) - set(exam.parameters))
    if extra:
        takes = ", ".join(exam.parameters) or "no parameters"
        raise ExamError(f"{name} does not take {', '.join(extra)} (it takes {takes})")
    missing = [p for p in exam.required if p not in given]
    if missing:
        allowed = exam.allowed(missing[0])
        hint = f" (one of {', '.join(allowed)})" if allowed else ""
        raise ExamError(f"{name} needs {', '.join(missing)}{hint}")
    for parameter, value in given.items():
        allowed = exam.allowed(parameter)
        if allowed is not None and value not in allowed:
            raise ExamError(f"{name} {parameter} must be one of {', '.join(allowed)}, not {excerpt(value)}")
        if allowed is None and len(value) > FREE_TEXT_MAX:
            raise ExamError(f"{name} {parameter} is longer than {FREE_TEXT_MAX} characters")
    return ExamCall(name, tuple(sorted(given.items())))


_CALL = re.compile(r"(\w+)\((.*)\)$", re.DOTALL)
_ARGUMENT = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


def read_exam_string(text: str) -> tuple[str, dict[str, str]]:
    """`ct(region="chest", contrast="yes")` → ("ct", {"region": "chest", "contrast": "yes"}), read as
    MedExAgent's `parse_exam_string` reads it: `key="value"` pairs, or one bare word for a tool's positional
    parameter (`blood_gas(arterial)`); a bare name (`cbc`) is a call without parameters. Raises ExamError."""
    text = (text or "").strip()
    if re.fullmatch(r"\w+", text):
        return text, {}
    match = _CALL.match(text)
    if match is None:
        raise ExamError(f"not an exam call: {text[:80]!r}")
    name, inner = match.group(1), match.group(2).strip()
    arguments = {m.group(1): m.group(2) for m in _ARGUMENT.finditer(inner)}
    if not arguments and re.fullmatch(r"[A-Za-z_]\w*", inner):
        arguments[_POSITIONAL.get(name, "type")] = inner
    elif inner and not arguments:
        raise ExamError(f"cannot read the arguments of {text[:80]!r}")
    return name, arguments


def parse_exam_string(text: str) -> ExamCall:
    """An exam string → a validated ExamCall (raises ExamError)."""
    return exam_call(*read_exam_string(text))


def recorded_exam(spelled: str, findings: str) -> RecordedExam:
    return RecordedExam(parse_exam_string(spelled), findings, spelled.strip())


def fold_value(name: str, parameter: str, value: str) -> str | None:
    """A recorded value in its allowed form, as MedExAgent's `normalize_param_value` (`data/tool.py`) folds it:
    lower case with "-" and " " as "_", then an allowed value it contains, then one that contains it (its
    alias table is not reproduced); None when none fits."""
    allowed = EXAMS[name].allowed(parameter) if name in EXAMS else None
    if allowed is None:
        return None
    folded = value.strip().lower().replace("-", "_").replace(" ", "_")
    if folded in allowed:
        return folded
    return next((v for v in allowed if v in folded), None) or next((v for v in allowed if folded in v), None)


def loaded_exam(spelled: str, findings: str) -> tuple[RecordedExam, list[str]]:
    """A work-up exam as MedExAgent's RL loader keeps it: every string its `parse_exam_string` reads, values
    folded where they fold (`fold_value`), others kept as written (lower-cased, as its executor compares them),
    a missing required parameter left missing; with a note for each such liberty. An unknown exam name raises
    ExamError: no tool could be offered for it."""
    try:
        return recorded_exam(spelled, findings), []
    except ExamError:
        pass
    name, arguments = read_exam_string(spelled)
    name = _normal(name)
    exam = EXAMS.get(name)
    if exam is None:
        raise ExamError(f"unknown exam {excerpt(name)}")
    notes, params = [], {}
    for parameter, value in arguments.items():
        if parameter not in exam.parameters:
            notes.append(f"{name} does not take {parameter}; kept as written")
        folded = fold_value(name, parameter, value)
        if folded is not None and folded != _normal(value):
            notes.append(f"{name} {parameter} {excerpt(value)} read as {folded!r}")
        elif folded is None and exam.allowed(parameter) is not None:
            notes.append(f"{name} {parameter} {excerpt(value)} is not an allowed value; kept as written")
        params[parameter] = folded or _normal(value)
    notes += [f"{name} lacks its required {p}; kept without it" for p in exam.required if p not in params]
    return RecordedExam(ExamCall(name, tuple(sorted(params.items()))), findings, spelled.strip()), notes


def format_findings(call: ExamCall, findings: str) -> str:
    """The result sentence MedExAgent's executor answers with (its `format_findings`)."""
    return findings_sentence(call.name, dict(call.params), findings)


def findings_sentence(name: str, arguments: dict, findings: str) -> str:
    """MedExAgent's `format_findings` on a call as written: its template filled from the arguments."""
    exam = EXAMS.get(name)
    template = exam.template if exam is not None else "The {exam_name} results: {findings}"
    try:
        return template.format_map({**arguments, "findings": findings, "exam_name": name})
    except KeyError:
        return f"The {name} results: {findings}"


def raw_findings(name: str, arguments: dict, text: str) -> str:
    """The findings inside a result sentence `findings_sentence` wrote (MedExAgent's conversation files hold
    tool messages in that form), or the text itself when it is not one."""
    opening = findings_sentence(name, arguments, "")
    return text[len(opening) :].strip() if opening and text.startswith(opening) else text


def expressible() -> list[str]:
    """Every exam string the vocabulary can express, one per choice a schema offers: the bare call of each exam
    that needs no parameter, each allowed value of each parameter, and each free-text parameter (as
    'unspecified'), with the exam's required parameters at their first value. 539 for MedExAgent's table."""
    strings = []
    for exam in EXAMS.values():
        base = {p: (exam.allowed(p) or ("unspecified",))[0] for p in exam.required}
        if not exam.required:
            strings.append(ExamCall(exam.name).key())
        for parameter, spec in exam.parameters.items():
            for value in spec.values or ("unspecified",):
                strings.append(ExamCall(exam.name, tuple(sorted({**base, parameter: value}.items()))).key())
    return list(dict.fromkeys(strings))


def tool_text(names: list[str]) -> str:
    """The offered exams as MedExAgent's prompt lists them (ToolRL style, allowed values spelled out)."""
    lines = []
    for name in names:
        exam = EXAMS[name]
        lines += [f"- Name: {exam.name}", f"  Description: {exam.description}"]
        if not exam.parameters:
            lines.append("  Parameters: None")
        else:
            lines.append("  Parameters:")
            for parameter, spec in exam.parameters.items():
                required = " (required)" if parameter in exam.required else ""
                lines.append(f"    - {parameter}{required}: {spec.description}")
                if spec.values:
                    lines.append(f"      Allowed values: {', '.join(spec.values)}")
        lines.append("")
    return "\n".join(lines)
