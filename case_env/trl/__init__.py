"""TRL's trainers on case-env (the `model` extra): `GRPOTrainer` with `environment_factory` whose environments
call a case-env server (`episode.py`), rewarded by the function verl uses (`reward.py`); `SFTTrainer` on
exported trajectories; both driven by `case-env train trl` (`train.py`)."""
