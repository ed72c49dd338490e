"""The case-reasoning environment's diagnostician, who reads a case report and names the diagnosis."""

ANSWER_RULE = (
    "First give your reasoning within <think> </think>. Then give the final diagnosis (just the name of the "
    "disease or entity) within <answer> </answer>, as the last thing you write."
)
