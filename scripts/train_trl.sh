#!/usr/bin/env bash
# CASE's order on TRL, end to end on one bank: SFT on a scripted agent's correct trajectories, then GRPO on the
# learner's own rollouts against the case-env server, then the base, SFT and RL checkpoints evaluated on the
# held-out splits through verl's loops (`case-env rollouts --model`), greedily. On a CPU it runs SmolLM2-135M;
# on GPUs pass any Hugging Face model (MODEL=Qwen/Qwen3-1.7B) and larger sizes.
#
#   scripts/train_trl.sh BANK_DIR DATA_ROOT OUT [AGENT]
#
# BANK_DIR holds train/val/test.parquet; DATA_ROOT is what the server serves; AGENT the scripted agent whose
# trajectories teach the first stage (default: the environment's first). Settings come from the environment:
# MODEL (smollm2), SFT_ROWS (80), SFT_EPOCHS (2), SFT_LR (5e-5), STEPS (20), PROMPTS (2), GENERATIONS (4), COMPLETION (384),
# LR (2e-5), SAVE_STEPS (5), TRAIN_LAYERS (0: all), CHECKPOINTING (yes), SEED (0), PORT (8770),
# EVAL_ROWS (100 per data source), SPLITS ("val test"), EVAL_LENGTH (1024). Stopped, it is started again with
# the same arguments: SFT is not redone and GRPO goes on from its last checkpoint.
set -euo pipefail
bank=${1:?bank directory}; root=${2:?data root}; out=${3:?output directory}; agent=${4:-scripted}
bin="$(dirname "$0")/../.venv/bin"
model=${MODEL:-smollm2}; port=${PORT:-8770}; url="http://127.0.0.1:$port"; seed=${SEED:-0}
mkdir -p "$out/eval"

"$bin/case-env" serve --data-root "$root" --port "$port" > "$out/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
for _ in $(seq 60); do curl -sf "$url/healthz" > /dev/null && break; sleep 1; done

# 1. what the first stage learns from: the scripted agent's correct trajectories on the train split, and
# 2. SFT on them (both skipped when a run stopped after them is started again)
if [ ! -f "$out/sft/final/config.json" ]; then
    "$bin/case-env" eval --bank "$bank/train.parquet" --agent "$agent" --server "$url" --out "$out/scripted" \
        --limit "${SFT_ROWS:-80}" --seed "$seed"
    "$bin/case-env" traj to-sft "$out/scripted" --out "$out/sft.parquet"
    "$bin/case-env" train trl sft --model "$model" --data "$out/sft.parquet" --out "$out/sft" \
        --epochs "${SFT_EPOCHS:-2}" --lr "${SFT_LR:-5e-5}" --seed "$seed"
fi

# 3. GRPO from the SFT checkpoint on the train split, continued from its last checkpoint when there is one
# (TRAIN_LAYERS=6 CHECKPOINTING=no: the cheapest step on a CPU, docs/models.md)
grpo_flags=(); compgen -G "$out/grpo/checkpoint-*" > /dev/null && grpo_flags+=(--resume)
[ "${CHECKPOINTING:-yes}" = no ] && grpo_flags+=(--no-gradient-checkpointing)
"$bin/case-env" train trl grpo --model "$out/sft/final" --bank "$bank/train.parquet" --out "$out/grpo" \
    --server-url "$url" --steps "${STEPS:-20}" --prompts "${PROMPTS:-2}" --generations "${GENERATIONS:-4}" \
    --max-completion "${COMPLETION:-384}" --lr "${LR:-2e-5}" --seed "$seed" --save-steps "${SAVE_STEPS:-5}" \
    --train-layers "${TRAIN_LAYERS:-0}" "${grpo_flags[@]}"

# 4. the three checkpoints on the held-out rows, the same command for each
for stage in base sft rl; do
    case $stage in base) ckpt=$model;; sft) ckpt=$out/sft/final;; rl) ckpt=$out/grpo/final;; esac
    for split in ${SPLITS:-val test}; do
        "$bin/case-env" rollouts --model "$ckpt" --bank "$bank" --split "$split" --server-url "$url" \
            --data-root "$root" --per-source "${EVAL_ROWS:-100}" --response-length "${EVAL_LENGTH:-1024}" --seed "$seed" \
            --out "$out/eval/$stage-$split" | tee "$out/eval/$stage-$split.txt"
    done
done
