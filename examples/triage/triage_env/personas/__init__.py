"""The triage nurse."""

ANSWER_RULE = "Finish with <answer>urgent</answer> or <answer>routine</answer> as the last thing you write."
