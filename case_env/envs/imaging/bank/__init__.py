"""The question bank: CASE-schema multiple-choice questions built from synthetic ground truth."""
