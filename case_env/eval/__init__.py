"""Evaluation: run a policy over a question bank against a live server and keep what it did."""
