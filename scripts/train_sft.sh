#!/usr/bin/env bash
# The supervised stage before RL on verl 0.9.1's SFT trainer (docs/training.md).
#
#   scripts/train_sft.sh --recipe medexagent --model OpenMeditron/Meditron3-8B --data sft/train.jsonl
#                        [--val sft/val.jsonl] [--gpus 8] [--nodes 1] [--checkpoint-dir DIR] [--dry-run]
#                        [extra hydra overrides of verl's sft_trainer_engine]
#
# --data: MedExAgent's conversation JSONL, CASE trajectories (an eval --out folder), or the parquet of
# `case-env traj to-sft`. The conversations are written beside it as verl's multi-turn SFT parquet in the
# recipe's form; --dry-run composes and checks the config and the rows on CPU and starts nothing. PYTHON
# picks the interpreter (the venv of `make train-env` on a GPU machine).
set -euo pipefail
exec "${PYTHON:-$(dirname "$0")/../.venv/bin/python}" -m case_env.verl.sft "$@"
