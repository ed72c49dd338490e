"""The clinic environment's clinician, who asks, examines and diagnoses."""

# MedExAgent's one answer format (its prompt's "[DIAGNOSIS: <your diagnosis>]", which also ends its episodes)
ANSWER_RULE = (
    "When you are confident, give your final diagnosis in exactly this format: [DIAGNOSIS: <your diagnosis>]; "
    "name several coexisting conditions separated by semicolons, never a list of alternatives."
)
