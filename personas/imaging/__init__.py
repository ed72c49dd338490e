"""The three CASE personas: Anatomist, Radiologist and Consultant answer multiple-choice questions."""

ANSWER_RULE = (
    "When you have the evidence, reason briefly and finish with your choice as a single option letter in "
    "the form <answer>X</answer>. The <answer> tag must be the last thing you write."
)
