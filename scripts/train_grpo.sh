#!/usr/bin/env bash
# GRPO with multi-turn tools on verl 0.9.1 against a case-env server (docs/training.md).
#
#   scripts/train_grpo.sh --model Qwen/Qwen2.5-VL-7B-Instruct --data bank/ [--recipe grpo|medexagent]
#                         [--gpus 8] [--nodes 1] [--server-url URL] [--server-host 0.0.0.0] [--token-file F]
#                         [--data-root data/synthetic] [--chat-template auto|model|shipped|FILE]
#                         [--checkpoint-dir DIR | --no-checkpoints] [--skip-preflight] [--dry-run [--print-config]]
#                         [extra hydra overrides]
#
# Starts `case-env serve` when nothing answers at --server-url (sized to the step, stopped afterwards), runs
# `case-env train preflight` and starts verl's main_ppo only when every check passes. --dry-run composes the
# config, validated by verl on CPU, and prints the preflight table last (the checks that need a server and a
# cluster skipped); it starts and writes nothing, exit 2 when a check fails (--print-config: the config too). PYTHON picks the interpreter: the venv of
# `make train-env ENGINE=vllm|sglang` on a GPU machine. Budgets (tool text 2048 characters, about 110-200
# vision tokens per image, 16384 response tokens) are explained in case_env/verl/launch.py.
set -euo pipefail
# paths stay relative to the caller's directory; only the default interpreter is found beside the script
exec "${PYTHON:-$(dirname "$0")/../.venv/bin/python}" -m case_env.verl.grpo "$@"
