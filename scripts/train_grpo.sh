#!/usr/bin/env bash
# GRPO with multi-turn tools on verl 0.9.1 against a case-env server.
#
#   scripts/train_grpo.sh --model Qwen/Qwen2.5-VL-7B-Instruct --data bank/ [--recipe grpo|medexagent] [--server-url URL]
#                         [--gpus 8] [--nodes 1] [--data-root data/synthetic] [--dry-run] [extra hydra overrides]
#
# Starts `case-env serve` when nothing answers at --server-url and stops it afterwards. --dry-run composes
# the full config with verl's Hydra files, validates it on CPU and exits. Budgets (tool text 2048 characters,
# about 110-200 vision tokens per image, 16384 response tokens) are explained in case_env/verl/launch.py.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" -m case_env.verl.launch "$@"
