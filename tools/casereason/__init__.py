"""The case-reasoning environment's tool: submit one diagnosis attempt."""
