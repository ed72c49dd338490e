"""The synthetic case reports' textbook: six presentations, each shared by eight look-alike diagnoses that
only an investigation tells apart (written for case-env; the findings are textbook descriptions).

Within a group every case opens with the same complaint and examination, so a reader who ignores results
can only rank eight candidates by risk factors; the results (the confirming one, or normal results that
exclude look-alikes) are what separates them. Each member names its risk factor, the investigation that
decides it, that investigation's abnormal result in this disease and its normal result otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Member:
    name: str
    aliases: tuple[str, ...]  # synonyms only, never a broader term: the grader treats them as the name
    risk: str  # a history item that points at it (and only weakly: it is often absent)
    test: str
    abnormal: str  # the test's result in this disease: confirms it
    normal: str  # the test's result otherwise: excludes it


@dataclass(frozen=True)
class Group:
    name: str
    complaint: str
    examination: str
    ages: tuple[int, int]
    members: tuple[Member, ...]


# One member per line group: the table is easier to read and to diff that way.
# fmt: off
GROUPS = (
    Group("chest pain", "sudden chest pain and breathlessness",
          "Heart rate was 112 beats per minute, blood pressure 128/76 mmHg and oxygen saturation 93 % on air.",
          (30, 80), (
        Member("myocardial infarction", ("acute myocardial infarction", "MI"),
               "smokes 20 cigarettes a day", "coronary angiography",
               "occlusion of the proximal left anterior descending artery", "unobstructed coronary arteries"),
        Member("pulmonary embolism", ("PE", "pulmonary embolus"),
               "took a long-haul flight the week before", "CT pulmonary angiography",
               "filling defects in both lower lobe pulmonary arteries", "no filling defect in the pulmonary arteries"),
        Member("aortic dissection", ("acute aortic dissection",),
               "has long-standing poorly controlled hypertension", "CT aortography",
               "an intimal flap from the aortic root to the arch", "a normal-calibre aorta without an intimal flap"),
        Member("acute pericarditis", ("pericarditis",),
               "had a viral illness two weeks earlier", "electrocardiography",
               "diffuse concave ST elevation with PR depression", "sinus tachycardia without ST-segment change"),
        Member("spontaneous pneumothorax", ("pneumothorax", "primary spontaneous pneumothorax"),
               "is tall and thin and smokes cannabis", "chest radiography",
               "a visceral pleural line at the right apex with absent lung markings beyond it",
               "clear lung fields without a pleural line"),
        Member("takotsubo cardiomyopathy", ("takotsubo syndrome", "stress cardiomyopathy"),
               "had a severe emotional shock the day before", "left ventriculography",
               "apical ballooning with basal hyperkinesis", "normal left ventricular contraction"),
        Member("Boerhaave syndrome", ("spontaneous oesophageal rupture",),
               "vomited forcefully and repeatedly after a heavy meal", "contrast oesophagography",
               "extravasation of contrast from the distal oesophagus into the left pleural space",
               "free passage of contrast without a leak"),
        Member("myocarditis", ("acute myocarditis",),
               "started immune checkpoint inhibitor therapy a month earlier", "cardiac MRI",
               "subepicardial late gadolinium enhancement of the lateral wall", "no late gadolinium enhancement"),
    )),
    Group("fever and confusion", "fever, headache and confusion",
          "Temperature was 38.6 °C, the neck was stiff and the Glasgow Coma Scale score was 13.", (18, 75), (
        Member("pneumococcal meningitis", ("Streptococcus pneumoniae meningitis",),
               "had a middle-ear infection the week before", "CSF Gram stain",
               "Gram-positive diplococci with 2,400 neutrophils/uL and glucose 1.1 mmol/L",
               "no organisms on the CSF Gram stain"),
        Member("herpes simplex encephalitis", ("HSV encephalitis", "herpes simplex virus encephalitis"),
               "has had recurrent cold sores", "CSF herpes simplex virus PCR",
               "herpes simplex virus type 1 DNA detected", "herpes simplex virus PCR negative"),
        Member("enteroviral meningitis", ("enterovirus meningitis",),
               "has a child at home with a febrile illness", "CSF enterovirus PCR",
               "enterovirus RNA detected with 180 lymphocytes/uL and a normal glucose", "enterovirus PCR negative"),
        Member("tuberculous meningitis", ("TB meningitis", "meningitis due to Mycobacterium tuberculosis"),
               "emigrated from a country where tuberculosis is endemic", "CSF adenosine deaminase and mycobacterial culture",
               "adenosine deaminase 18 U/L and Mycobacterium tuberculosis grown in culture",
               "adenosine deaminase 2 U/L and a negative mycobacterial culture"),
        Member("cryptococcal meningitis", ("Cryptococcus neoformans meningitis",),
               "has untreated HIV infection with a CD4 count of 45 cells/uL", "CSF cryptococcal antigen",
               "cryptococcal antigen positive at a titre of 1:1024", "cryptococcal antigen negative"),
        Member("brain abscess", ("cerebral abscess",),
               "had a dental extraction three weeks earlier", "contrast MRI of the brain",
               "a ring-enhancing lesion with restricted diffusion in the left frontal lobe",
               "no focal lesion on contrast MRI"),
        Member("cerebral venous sinus thrombosis", ("CVST", "dural venous sinus thrombosis"),
               "takes the combined oral contraceptive pill", "MR venography",
               "absent flow in the superior sagittal sinus", "patent dural venous sinuses"),
        Member("anti-NMDA receptor encephalitis", ("anti-NMDAR encephalitis", "NMDA receptor encephalitis"),
               "had two weeks of anxiety and odd behaviour beforehand", "CSF NMDA receptor antibodies",
               "NMDA receptor antibodies detected in the CSF", "no NMDA receptor antibodies in the CSF"),
    )),
    Group("jaundice", "jaundice, dark urine and itching",
          "Bilirubin was 96 umol/L and alkaline phosphatase 520 U/L.", (25, 80), (
        Member("choledocholithiasis", ("common bile duct stone",),
               "had gallstones on a scan two years ago", "endoscopic ultrasound",
               "a 9 mm stone in the distal common bile duct", "a clear common bile duct"),
        Member("pancreatic adenocarcinoma", ("pancreatic ductal adenocarcinoma",),
               "has new-onset diabetes and has lost 8 kg", "pancreatic-protocol CT",
               "a 3 cm hypoenhancing mass in the pancreatic head", "a normal pancreas"),
        Member("primary sclerosing cholangitis", ("PSC",),
               "has ulcerative colitis", "MRCP",
               "multifocal strictures and beading of the intrahepatic and extrahepatic ducts",
               "a normal biliary tree without strictures"),
        Member("primary biliary cholangitis", ("PBC", "primary biliary cirrhosis"),
               "has autoimmune hypothyroidism", "antimitochondrial antibody",
               "antimitochondrial antibody positive at 1:640", "antimitochondrial antibody negative"),
        Member("autoimmune hepatitis", ("AIH",),
               "has a sister with type 1 diabetes", "anti-smooth muscle antibody and IgG",
               "anti-smooth muscle antibody 1:320 with IgG 28 g/L",
               "anti-smooth muscle antibody negative with IgG 11 g/L"),
        Member("Wilson disease", ("Wilson's disease", "hepatolenticular degeneration"),
               "has had a tremor for six months", "serum caeruloplasmin",
               "caeruloplasmin 0.05 g/L, markedly low", "caeruloplasmin 0.32 g/L"),
        Member("hepatitis E", ("acute hepatitis E", "hepatitis E virus infection"),
               "ate undercooked pork sausages the month before", "hepatitis E IgM",
               "hepatitis E IgM positive", "hepatitis E IgM negative"),
        Member("cholangiocarcinoma", ("bile duct cancer",),
               "lived for many years in north-east Thailand", "biliary brushing cytology",
               "malignant cells in brushings from a hilar stricture", "benign cytology on biliary brushings"),
    )),
    Group("hot swollen knee", "an acutely hot, swollen and painful right knee",
          "Temperature was 37.9 °C and CRP 96 mg/L; the knee held a large effusion.", (20, 80), (
        Member("gout", ("acute gout", "gouty arthritis"),
               "takes a thiazide diuretic and drinks beer daily", "polarised microscopy of the synovial fluid",
               "needle-shaped negatively birefringent crystals", "no crystals under polarised light"),
        Member("calcium pyrophosphate deposition disease", ("pseudogout", "CPPD", "acute CPP crystal arthritis"),
               "has primary hyperparathyroidism", "knee radiography",
               "chondrocalcinosis of both menisci", "no chondrocalcinosis"),
        Member("staphylococcal septic arthritis", ("Staphylococcus aureus septic arthritis",),
               "had a steroid injection into the knee ten days earlier", "synovial fluid culture",
               "Staphylococcus aureus grown with 86,000 white cells/uL", "a sterile synovial fluid culture"),
        Member("gonococcal arthritis", ("gonococcal septic arthritis",),
               "has a new sexual partner", "Neisseria gonorrhoeae nucleic acid amplification test",
               "Neisseria gonorrhoeae detected on the urethral swab", "no Neisseria gonorrhoeae detected"),
        Member("Lyme arthritis", ("Borrelia arthritis",),
               "was bitten by a tick while hiking in New England", "Borrelia serology",
               "Borrelia burgdorferi IgG positive on immunoblot", "negative Borrelia serology"),
        Member("reactive arthritis", ("post-infectious arthritis",),
               "had diarrhoea three weeks earlier", "stool culture",
               "Campylobacter jejuni isolated from the stool", "a negative stool culture"),
        Member("tuberculous arthritis", ("tuberculosis of the knee", "TB arthritis"),
               "emigrated from a country where tuberculosis is endemic", "synovial biopsy",
               "caseating granulomas with acid-fast bacilli", "a synovial biopsy without granulomas"),
        Member("pigmented villonodular synovitis", ("PVNS", "tenosynovial giant cell tumour"),
               "has had swelling of the same knee on and off for two years", "knee MRI",
               "haemosiderin-laden synovial proliferation that blooms on gradient-echo images",
               "an effusion without synovial proliferation"),
    )),
    Group("haematuria and kidney injury", "blood in the urine, swollen legs and a rising creatinine",
          "Creatinine was 310 umol/L, blood pressure 168/98 mmHg and the urine dipstick showed protein 2+.",
          (18, 80), (
        Member("IgA nephropathy", ("IgA glomerulonephritis", "Berger disease"),
               "has visible haematuria with every sore throat", "kidney biopsy immunofluorescence",
               "dominant mesangial IgA deposits", "no mesangial IgA deposits"),
        Member("post-streptococcal glomerulonephritis", ("poststreptococcal glomerulonephritis", "PSGN"),
               "had impetigo three weeks earlier", "antistreptolysin O titre and complement",
               "antistreptolysin O 800 IU/mL with a low C3", "antistreptolysin O 90 IU/mL with a normal C3"),
        Member("anti-GBM disease", ("anti-glomerular basement membrane disease", "Goodpasture disease"),
               "coughed up blood the week before", "anti-GBM antibody",
               "anti-glomerular basement membrane antibody 180 U/mL", "anti-GBM antibody negative"),
        Member("granulomatosis with polyangiitis", ("GPA", "Wegener granulomatosis"),
               "has had bloody nasal crusting for months", "ANCA",
               "PR3-ANCA 96 IU/mL", "ANCA negative"),
        Member("lupus nephritis", (),
               "has a photosensitive facial rash", "anti-dsDNA antibody and complement",
               "anti-dsDNA 420 IU/mL with low C3 and C4", "anti-dsDNA negative"),
        Member("membranous nephropathy", ("membranous glomerulonephritis",),
               "had a deep vein thrombosis last year", "anti-PLA2R antibody",
               "anti-PLA2R antibody 210 RU/mL", "anti-PLA2R antibody negative"),
        Member("acute interstitial nephritis", ("AIN", "tubulointerstitial nephritis"),
               "started omeprazole six weeks earlier", "urine microscopy",
               "white cell casts and eosinophiluria", "no white cell casts"),
        Member("atheroembolic renal disease", ("cholesterol embolism", "cholesterol crystal embolism"),
               "had coronary angiography three weeks earlier", "fundoscopy",
               "Hollenhorst plaques in the retinal arterioles", "normal retinal arterioles"),
    )),
    Group("fever and cough", "fever, cough and breathlessness",
          "Temperature was 38.9 °C and oxygen saturation 90 % on air; the chest radiograph showed right lower "
          "lobe consolidation.", (20, 85), (
        Member("pneumococcal pneumonia", ("Streptococcus pneumoniae pneumonia",),
               "had a splenectomy years ago", "urinary pneumococcal antigen",
               "urinary pneumococcal antigen positive", "urinary pneumococcal antigen negative"),
        Member("Legionella pneumonia", (),
               "came back from a hotel holiday with a whirlpool spa", "urinary Legionella antigen",
               "urinary Legionella antigen positive", "urinary Legionella antigen negative"),
        Member("Mycoplasma pneumonia", ("Mycoplasma pneumoniae pneumonia",),
               "lives in a college dormitory with an outbreak of cough", "Mycoplasma PCR of a throat swab",
               "Mycoplasma pneumoniae DNA detected", "Mycoplasma PCR negative"),
        Member("Pneumocystis pneumonia", ("Pneumocystis jirovecii pneumonia", "PJP", "PCP"),
               "takes prednisolone 40 mg daily for vasculitis", "silver stain of bronchoalveolar lavage",
               "Pneumocystis jirovecii cysts on Grocott silver stain", "no Pneumocystis on silver stain"),
        Member("pulmonary tuberculosis", ("pulmonary TB",),
               "was released from prison three months ago", "sputum Xpert MTB/RIF",
               "Mycobacterium tuberculosis detected, rifampicin resistance not detected",
               "Mycobacterium tuberculosis not detected"),
        Member("invasive pulmonary aspergillosis", ("invasive aspergillosis",),
               "is neutropenic after chemotherapy for leukaemia", "serum galactomannan",
               "galactomannan index 3.1", "galactomannan index 0.1"),
        Member("acute eosinophilic pneumonia", ("eosinophilic pneumonia",),
               "took up smoking two weeks ago", "bronchoalveolar lavage cell count",
               "eosinophils 42 % of the lavage cells", "eosinophils 1 % of the lavage cells"),
        Member("influenza pneumonia", ("influenza A pneumonia",),
               "was not vaccinated this winter", "nasopharyngeal influenza PCR",
               "influenza A RNA detected", "influenza PCR negative"),
    )),
)
# fmt: on
MEMBERS = {m.name: (g, m) for g in GROUPS for m in g.members}
