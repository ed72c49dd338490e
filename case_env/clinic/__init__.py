"""The clinic environment (MedExAgent-style): a simulated patient to question, an exam catalogue with costs,
and a diagnosis as the final answer, under deterministic patient and exam noise."""
