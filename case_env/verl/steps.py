"""What a training step logs beyond verl's own: the reward's numeric keys (`acc`, `format_ok`,
`judge_fallback`, `infra_error`, `calls_dropped`, an environment's own), averaged over the step's trajectories
as `reward/<key>/mean`, and the trajectories verl dropped because their loop raised (`rollouts/dropped`).

verl 0.9.1's V1 trainer logs a training step's reward score and none of the reward's other keys
(`PPOTrainer._compute_metrics`, trainer/ppo/v1/trainer_base.py); they reached the log only at validation,
which MedExAgent's recipe turns off. Its agent-loop workers keep each trajectory's reward keys in the
trajectory's `extra_fields` (`reward_extra_info`, trainer/ppo/v1/agent_loop_tq.py); the trainer mode
`case_env`, verl's synchronous trainer with those means added, reads them there. verl builds its trainer in a
Ray actor, so `setup` registers the mode in every Ray worker of the job, named by the launcher as Ray's
`worker_process_setup_hook`.
"""

from __future__ import annotations

import math
from typing import Any

MODE = "case_env"  # trainer.v1.trainer_mode
HOOK = f"{__name__}.setup"


def means(extra_fields: list[Any]) -> dict[str, float]:
    """`reward/<key>/mean` of every numeric reward key over the trajectories that have it (bools count as 0/1;
    the score itself is verl's `critic/score`)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for fields in extra_fields:
        info = fields.get("reward_extra_info") if isinstance(fields, dict) else None
        for key, value in (info or {}).items():
            if key == "score" or not isinstance(value, int | float) or not math.isfinite(value):
                continue
            sums[key] = sums.get(key, 0.0) + float(value)
            counts[key] = counts.get(key, 0) + 1
    return {f"reward/{key}/mean": sums[key] / counts[key] for key in sorted(sums)}


def step_metrics(extra_fields: list[Any], expected: int) -> dict[str, float]:
    """The step's reward means and `rollouts/dropped`: the trajectories a step should have had (prompts x
    samples) less those it has. verl's V1 trainer drops a trajectory whose loop raised and pads the batch in
    its place (`is_padding`, not counted here)."""
    return {**means(extra_fields), "rollouts/dropped": float(max(0, expected - len(extra_fields)))}


def setup() -> None:
    """Register the trainer mode `case_env` in this process (once)."""
    from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer
    from verl.trainer.ppo.v1.trainer_base import (
        TRAINER_REGISTRY,
        tq,  # the TransferQueue client verl's trainer reads
    )

    if MODE in TRAINER_REGISTRY:
        return

    @register_trainer(MODE)
    class CaseTrainer(PPOTrainerSync):
        """verl's synchronous trainer, its step's metrics with the reward's keys."""

        def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
            super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
            data = tq.kv_batch_get(
                keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"]
            )
            real = [not tag.get("is_padding", False) for tag in batch.tags]
            fields = [f for f, keep in zip(data.pop("extra_fields").tolist(), real, strict=True) if keep]
            config = self.config
            metrics.update(
                step_metrics(fields, config.data.train_batch_size * config.actor_rollout_ref.rollout.n)
            )
