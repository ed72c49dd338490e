"""A pretrained language model on this machine: fetched and prepared once (`prepare.py`), generating for many
callers at once on the CPU (`engine.py`). The verl adapter, the TRL trainer and the benchmarks use it; it
needs the `model` extra."""
