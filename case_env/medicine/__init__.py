"""Medical knowledge two environments share: the condition table, the exam vocabulary, synthetic
presentations drawn from them, reading symptoms against the table, and matching diagnoses."""
