"""The synthetic clinic's conditions: six presenting problems, five conditions each, written so that the
history and symptoms narrow a case to its presenting problem but rarely to one condition, and the recorded
work-up tells the conditions apart. That is the property the environment must reward: asking alone is not
enough, and ordering every exam is expensive.

Each condition lists its lay symptoms, its usual pain descriptor and time course, the history that goes
with it, the exams its work-up records (with abnormal findings) and, per exam, the `signature` words a
reader of the findings would take as the sign of that condition. The same table is the textbook of the
scripted clinician (`case_env.envs.clinic.baselines`), which never sees a case's diagnosis.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    part: str  # where the chief complaint sits, in lay words
    complaint: str  # template with {severity}, {descriptor}, {part}
    shared: tuple[str, ...]  # symptoms every condition of the family may have
    workup: dict[str, str]  # exam → findings when unremarkable


@dataclass(frozen=True)
class Condition:
    name: str
    family: str
    descriptor: str
    duration: tuple[int, int, str]  # low, high, unit
    symptoms: tuple[str, ...]  # specific to this condition
    findings: dict[str, str]  # exam → abnormal findings
    signature: dict[str, tuple[str, ...]]  # exam → words that mark this condition in its findings
    history: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    ages: tuple[int, int] = (25, 80)
    sex: str = "any"


# One entry per line: the table is easier to read and to diff that way.
# fmt: off
FAMILIES = {f.name: f for f in (
    Family("chest_pain", "chest", "I have a {severity} {descriptor} pain in my {part}",
           ("I get short of breath", "I feel sweaty and clammy", "my heart feels like it is racing"),
           {'ecg()': "Sinus rhythm at 84 beats per minute, normal axis, no ST-segment or T-wave changes.",
            'cardiac_enzyme(marker="troponin")': "High-sensitivity troponin I 6 ng/L (reference < 14 ng/L).",
            'xray(region="chest")': "Clear lungs, normal cardiomediastinal silhouette, no pneumothorax.",
            'cbc()': "Haemoglobin 13.9 g/dL, white cells 7.8 x10^9/L, platelets 254 x10^9/L."}),
    Family("cough_fever", "chest", "I have had a {severity} {descriptor} cough",
           ("I have a fever", "I feel very tired", "I get short of breath"),
           {'xray(region="chest")': "Clear lungs without consolidation, effusion or mass.",
            'cbc()': "White cells 8.1 x10^9/L with a normal differential; haemoglobin 13.5 g/dL.",
            'inflammatory_marker(marker="crp")': "CRP 4 mg/L (reference < 5 mg/L).",
            'culture(source="sputum")': "Normal respiratory flora only."}),
    Family("abdominal_pain", "belly", "I have a {severity} {descriptor} pain in my {part}",
           ("I feel sick to my stomach", "I threw up", "I have a fever"),
           {'ultrasound(region="abdomen")': "Normal liver, gallbladder, pancreas and kidneys; no free fluid.",
            'blood_test(test="lipase")': "Lipase 32 U/L (reference 10-60 U/L).",
            'cbc()': "White cells 8.9 x10^9/L, haemoglobin 14.1 g/dL.",
            'urinalysis()': "No blood, leukocytes or nitrites."}),
    Family("headache", "head", "I have a {severity} {descriptor} headache",
           ("light hurts my eyes", "I feel sick to my stomach", "my neck feels stiff"),
           {'ct(contrast="no", region="head")': "No haemorrhage, mass effect or acute infarct.",
            'csf_analysis()': "Clear fluid, 2 white cells/uL, protein 0.35 g/L, glucose 3.6 mmol/L.",
            'inflammatory_marker(marker="esr")': "ESR 12 mm/h.",
            'mri(contrast="yes", region="head")': "Normal brain parenchyma without enhancing lesions."}),
    Family("fatigue", "whole body", "I feel {descriptor} and worn out all the time, and it is {severity}",
           ("I have no energy", "I get dizzy when I stand up", "I have been losing weight"),
           {'cbc()': "Haemoglobin 13.8 g/dL, MCV 89 fL, platelets 261 x10^9/L.",
            'thyroid_function_test()': "TSH 1.9 mU/L, free T4 15 pmol/L.",
            'blood_test(test="hba1c")': "HbA1c 36 mmol/mol (5.4 %).",
            'renal_function_test()': "Creatinine 78 umol/L, eGFR > 90 mL/min/1.73m2."}),
    Family("joint_pain", "knee", "I have a {severity} {descriptor} pain in my {part}",
           ("the joint is swollen", "it is stiff in the mornings", "I have a fever"),
           {'xray(region="lower_extremity")': "Normal joint space and bone density, no erosions.",
            'rheumatoid_factor()': "Rheumatoid factor 8 IU/mL (negative).",
            'arthrocentesis(joint="knee")': "Straw-coloured fluid, 200 white cells/uL, no crystals, Gram stain negative.",
            'inflammatory_marker(marker="crp")': "CRP 3 mg/L."}),
)}
# fmt: on

# One entry per line: the table is easier to read and to diff that way.
# fmt: off
CONDITIONS = {c.name: c for c in (
    # chest pain
    Condition("myocardial infarction", "chest_pain", "crushing", (1, 6, "hours"),
              ("the pain goes down my left arm",), {
                  'ecg()': "ST-segment elevation in leads II, III and aVF.",
                  'cardiac_enzyme(marker="troponin")': "High-sensitivity troponin I 2,450 ng/L, markedly elevated."},
              {'ecg()': ("st-segment elevation in leads",), 'cardiac_enzyme(marker="troponin")': ("markedly elevated",)},
              ("high blood pressure", "type 2 diabetes", "smokes 20 cigarettes a day"),
              ("heart attack", "mi", "acute myocardial infarction", "stemi"), (45, 85)),
    Condition("pericarditis", "chest_pain", "sharp", (2, 5, "days"),
              ("the pain eases when I lean forward",), {
                  'ecg()': "Diffuse concave ST elevation with PR depression."},
              {'ecg()': ("diffuse", "pr depression")}, ("a cold two weeks ago",),
              ("acute pericarditis",), (20, 60)),
    Condition("pulmonary embolism", "chest_pain", "sharp", (1, 3, "days"),
              ("my calf is swollen",), {
                  'angiography(region="pulmonary", type="ct_angiography")': "Filling defect in the right lower lobe pulmonary artery.",
                  'ecg()': "Sinus tachycardia at 118 beats per minute."},
              {'angiography(region="pulmonary", type="ct_angiography")': ("filling defect",)},
              ("a long flight last week", "takes the contraceptive pill"), ("pe", "pulmonary embolus"),
              (25, 75)),
    Condition("spontaneous pneumothorax", "chest_pain", "stabbing", (2, 12, "hours"),
              ("it started suddenly while I was resting",), {
                  'xray(region="chest")': "Visible visceral pleural line at the right apex with absent lung markings beyond it."},
              {'xray(region="chest")': ("pleural line", "absent lung markings")}, ("smokes",),
              ("pneumothorax", "collapsed lung"), (18, 40)),
    Condition("gastroesophageal reflux disease", "chest_pain", "burning", (3, 8, "weeks"),
              ("it is worse after big meals and lying down",), {
                  'endoscopy(type="egd")': "Erythema and linear erosions of the distal oesophagus, grade B oesophagitis."},
              {'endoscopy(type="egd")': ("oesophagitis",)}, ("overweight",),
              ("gerd", "acid reflux", "reflux oesophagitis", "gastro-oesophageal reflux disease")),
    # cough and fever
    Condition("community-acquired pneumonia", "cough_fever", "wet", (3, 7, "days"),
              ("I am coughing up green phlegm",), {
                  'xray(region="chest")': "Right lower lobe consolidation with air bronchograms.",
                  'cbc()': "White cells 16.2 x10^9/L with neutrophilia."},
              {'xray(region="chest")': ("consolidation",)}, ("chronic obstructive pulmonary disease",),
              ("pneumonia", "cap", "bacterial pneumonia")),
    Condition("acute bronchitis", "cough_fever", "dry", (5, 14, "days"),
              ("my chest feels raw when I cough",), {
                  'physical_examination(region="chest")': "Scattered wheeze and coarse crackles that clear with coughing; no focal signs."},
              {'physical_examination(region="chest")': ("clear with coughing",)}, (),
              ("bronchitis",), (18, 70)),
    Condition("influenza", "cough_fever", "dry", (1, 4, "days"),
              ("my muscles ache all over",), {
                  'pcr_test(target="influenza")': "Influenza A RNA detected."},
              {'pcr_test(target="influenza")': ("influenza a rna detected",)}, ("no flu vaccine this year",),
              ("flu", "influenza a")),
    Condition("pulmonary tuberculosis", "cough_fever", "wet", (4, 10, "weeks"),
              ("I wake up soaked in sweat at night",), {
                  'xray(region="chest")': "Upper lobe cavitating lesion with surrounding nodules.",
                  'culture(source="sputum")': "Acid-fast bacilli seen; Mycobacterium tuberculosis complex grown."},
              {'culture(source="sputum")': ("acid-fast bacilli", "mycobacterium")},
              ("moved from a country where tuberculosis is common",), ("tuberculosis", "tb"),
              (20, 70)),
    Condition("lung cancer", "cough_fever", "dry", (2, 5, "months"),
              ("I coughed up some blood",), {
                  'ct(contrast="yes", region="chest")': "Spiculated 3.2 cm mass in the left upper lobe with hilar lymphadenopathy."},
              {'ct(contrast="yes", region="chest")': ("spiculated",)}, ("smoked for 40 years",),
              ("pulmonary neoplasm", "bronchial carcinoma", "lung carcinoma"), (50, 85)),
    # abdominal pain
    Condition("acute appendicitis", "abdominal_pain", "sharp", (12, 36, "hours"),
              ("the pain started around my belly button and moved down to the right",), {
                  'ct(contrast="yes", region="abdomen")': "Dilated 11 mm appendix with periappendiceal fat stranding.",
                  'cbc()': "White cells 14.8 x10^9/L with neutrophilia."},
              {'ct(contrast="yes", region="abdomen")': ("dilated 11 mm appendix",)}, (),
              ("appendicitis",), (12, 45)),
    Condition("acute cholecystitis", "abdominal_pain", "cramping", (1, 3, "days"),
              ("the pain is under my right ribs and goes to my shoulder",), {
                  'ultrasound(region="abdomen")': "Thickened gallbladder wall with gallstones and a positive sonographic Murphy sign."},
              {'ultrasound(region="abdomen")': ("thickened gallbladder wall",)}, ("overweight",),
              ("cholecystitis", "gallbladder inflammation"), (30, 70), sex="F"),
    Condition("acute pancreatitis", "abdominal_pain", "boring", (1, 2, "days"),
              ("the pain goes straight through to my back",), {
                  'blood_test(test="lipase")': "Lipase 1,840 U/L, more than three times the upper limit."},
              {'blood_test(test="lipase")': ("more than three times",)}, ("drinks heavily", "gallstones"),
              ("pancreatitis",), (30, 70)),
    Condition("peptic ulcer disease", "abdominal_pain", "gnawing", (2, 6, "weeks"),
              ("the pain gets better when I eat",), {
                  'endoscopy(type="egd")': "A 9 mm clean-based ulcer in the duodenal bulb."},
              {'endoscopy(type="egd")': ("ulcer",)}, ("takes ibuprofen most days",),
              ("peptic ulcer", "duodenal ulcer", "stomach ulcer", "pud")),
    Condition("nephrolithiasis", "abdominal_pain", "colicky", (4, 24, "hours"),
              ("the pain goes from my side down to my groin",), {
                  'ct(contrast="no", region="abdomen")': "A 5 mm calculus at the left vesicoureteric junction with mild hydronephrosis.",
                  'urinalysis()': "Microscopic haematuria, no leukocytes or nitrites."},
              {'ct(contrast="no", region="abdomen")': ("calculus",)}, ("a kidney stone years ago",),
              ("kidney stone", "renal colic", "urolithiasis", "renal calculus"), (25, 65), sex="M"),
    # headache
    Condition("migraine", "headache", "throbbing", (4, 24, "hours"),
              ("I saw zigzag lights before it started",), {
                  'physical_examination(region="head")': "Normal neurological examination between attacks; no papilloedema."},
              {'physical_examination(region="head")': ("normal neurological examination",)},
              ("similar headaches since her teens",), ("migraine with aura",), (16, 50), sex="F"),
    Condition("bacterial meningitis", "headache", "pounding", (1, 2, "days"),
              ("I have a rash on my legs",), {
                  'csf_analysis()': "Turbid fluid, 2,300 white cells/uL (90 % neutrophils), glucose 1.1 mmol/L, protein 2.8 g/L."},
              {'csf_analysis()': ("turbid", "neutrophils")}, (), ("meningitis",), (16, 60)),
    Condition("subarachnoid haemorrhage", "headache", "explosive", (2, 12, "hours"),
              ("it came on like a thunderclap, the worst of my life",), {
                  'ct(contrast="no", region="head")': "Hyperdense blood in the basal cisterns and Sylvian fissures."},
              {'ct(contrast="no", region="head")': ("hyperdense blood",)}, ("high blood pressure",),
              ("subarachnoid hemorrhage", "sah", "brain bleed"), (35, 70)),
    Condition("brain tumour", "headache", "dull", (1, 4, "months"),
              ("it is worst when I wake up in the morning",), {
                  'mri(contrast="yes", region="head")': "A 4 cm ring-enhancing mass in the right frontal lobe with surrounding oedema."},
              {'mri(contrast="yes", region="head")': ("ring-enhancing mass",)}, (),
              ("brain tumor", "glioma", "intracranial neoplasm", "brain neoplasm"), (40, 80)),
    Condition("giant cell arteritis", "headache", "aching", (2, 6, "weeks"),
              ("my jaw hurts when I chew",), {
                  'inflammatory_marker(marker="esr")': "ESR 96 mm/h, strongly raised.",
                  'biopsy(site="soft_tissue")': "Granulomatous inflammation of the arterial wall with giant cells."},
              {'inflammatory_marker(marker="esr")': ("strongly raised",)}, ("polymyalgia rheumatica",),
              ("temporal arteritis", "gca"), (60, 85)),
    # fatigue
    Condition("hypothyroidism", "fatigue", "slowed down", (3, 9, "months"),
              ("I feel cold when nobody else does",), {
                  'thyroid_function_test()': "TSH 38 mU/L (reference 0.4-4.0), free T4 6 pmol/L (reference 12-22)."},
              {'thyroid_function_test()': ("tsh 38",)}, ("a sister with thyroid disease",),
              ("underactive thyroid", "hashimoto thyroiditis"), (30, 75), sex="F"),
    Condition("iron deficiency anaemia", "fatigue", "weak", (1, 4, "months"),
              ("my periods have been very heavy",), {
                  'cbc()': "Haemoglobin 8.4 g/dL, MCV 68 fL: microcytic anaemia.",
                  'iron_studies()': "Ferritin 4 ug/L, transferrin saturation 6 %."},
              {'cbc()': ("microcytic anaemia",)}, (),
              ("iron deficiency anemia", "anaemia", "anemia", "iron deficiency"), (18, 50), sex="F"),
    Condition("type 2 diabetes mellitus", "fatigue", "drained", (2, 6, "months"),
              ("I am always thirsty and I pee a lot",), {
                  'blood_test(test="hba1c")': "HbA1c 84 mmol/mol (9.8 %)."},
              {'blood_test(test="hba1c")': ("9.8 %",)}, ("overweight", "a father with diabetes"),
              ("type 2 diabetes", "diabetes mellitus type 2", "t2dm", "diabetes"), (40, 80)),
    Condition("vitamin b12 deficiency", "fatigue", "weak", (3, 12, "months"),
              ("my feet tingle",), {
                  'blood_test(test="vitamin_b12")': "Vitamin B12 92 ng/L (reference > 200 ng/L).",
                  'cbc()': "Haemoglobin 10.1 g/dL, MCV 109 fL: macrocytic anaemia."},
              {'blood_test(test="vitamin_b12")': ("92 ng/l",)}, ("a strict vegan diet",),
              ("b12 deficiency", "pernicious anaemia", "pernicious anemia", "cobalamin deficiency"), (40, 85)),
    Condition("chronic kidney disease", "fatigue", "tired", (6, 12, "months"),
              ("my ankles are puffy",), {
                  'renal_function_test()': "Creatinine 310 umol/L, eGFR 17 mL/min/1.73m2, potassium 5.6 mmol/L."},
              {'renal_function_test()': ("egfr 17",)}, ("high blood pressure", "type 2 diabetes"),
              ("ckd", "renal failure", "chronic renal failure"), (50, 85)),
    # joint pain
    Condition("gout", "joint_pain", "throbbing", (1, 3, "days"),
              ("it started overnight and even the bed sheet hurts",), {
                  'arthrocentesis(joint="knee")': "Needle-shaped negatively birefringent monosodium urate crystals."},
              {'arthrocentesis(joint="knee")': ("urate crystals",)}, ("drinks beer most days",),
              ("gouty arthritis", "acute gout"), (35, 80), sex="M"),
    Condition("rheumatoid arthritis", "joint_pain", "aching", (2, 6, "months"),
              ("my finger joints on both hands hurt too",), {
                  'rheumatoid_factor()': "Rheumatoid factor 186 IU/mL (strongly positive); anti-CCP positive."},
              {'rheumatoid_factor()': ("strongly positive",)}, (), ("ra",), (25, 70), sex="F"),
    Condition("septic arthritis", "joint_pain", "hot", (1, 3, "days"),
              ("I cannot put any weight on it",), {
                  'arthrocentesis(joint="knee")': "Purulent fluid, 86,000 white cells/uL, Gram-positive cocci in clusters."},
              {'arthrocentesis(joint="knee")': ("purulent",)}, ("a knee injection last month",),
              ("infectious arthritis", "bacterial arthritis")),
    Condition("osteoarthritis", "joint_pain", "grinding", (1, 5, "years"),
              ("it is worse at the end of the day",), {
                  'xray(region="lower_extremity")': "Medial joint space narrowing with osteophytes and subchondral sclerosis."},
              {'xray(region="lower_extremity")': ("osteophytes",)}, ("overweight",),
              ("degenerative joint disease", "oa", "osteoarthrosis"), (50, 85)),
    Condition("systemic lupus erythematosus", "joint_pain", "aching", (1, 4, "months"),
              ("I get a rash on my cheeks in the sun",), {
                  'blood_test(test="anti_dsdna")': "Anti-dsDNA antibodies strongly positive; ANA positive 1:640."},
              {'blood_test(test="anti_dsdna")': ("anti-dsdna antibodies strongly positive",)}, (),
              ("sle", "lupus"), (18, 50), sex="F"),
)}
# fmt: on
