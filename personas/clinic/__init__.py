"""The clinic environment's clinician, who asks, examines and diagnoses."""

ANSWER_RULE = (
    "When you are confident, finish with the diagnosis as <answer>condition</answer>; name several "
    "coexisting conditions separated by semicolons (<answer>condition; condition</answer>), never a list of "
    "alternatives. The <answer> tag must be the last thing you write."
)
