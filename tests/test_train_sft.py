"""The supervised stage (`scripts/train_sft.sh --recipe medexagent`) composed and checked on CPU by verl 0.9.1's
own config and MultiTurnSFTDataset: over a conversation in MedExAgent's `sft/train.jsonl` layout, and over the
parquet `case-env traj to-sft` writes from CASE trajectories."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from case_env.core.sft_data import write_sft
from case_env.verl import sft
from case_env.verl.offline import TEMPLATE
from tests import qwen_models
from tests.test_clinic_protocols import RECORD
from tests.verl_rows import REPO


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """Qwen's tokenizer with a template that renders a conversation turn by turn as it renders it whole (as
    Meditron3's Llama template does; Qwen3's adds <think> tags to the last turn, which verl's dataset refuses)."""
    out = qwen_models.model_dir(tmp_path_factory.mktemp("sft") / "model", "qwen2", template=TEMPLATE)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen2ForCausalLM"]}))
    return out


def test_the_medexagent_sft_recipe_composes_and_checks_over_its_conversation_file(
    checkpoint, tmp_path, capsys
):
    data = tmp_path / "sft" / "train.jsonl"
    data.parent.mkdir()
    data.write_text(json.dumps(RECORD) + "\n" + json.dumps({**RECORD, "patient_id": "pmc-18"}) + "\n")
    argv = ["--recipe", "medexagent", "--model", str(checkpoint), "--data", str(data), "--gpus", "2"]
    assert sft.main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "2 conversations through verl's MultiTurnSFTDataset" in out and "dry run: SFT config" in out
    trained, total = map(
        int, out.split("tokens (max_length 4096), ")[1].split(" tokens trained")[0].split(" of ")
    )
    assert 0 < trained < total  # the loss on the doctor's turns only
    rows = pq.read_table(tmp_path / "sft" / "train.verl_sft.parquet").to_pylist()
    messages = rows[0]["messages"]
    # MedExAgent's serialisation: calls as <tool_call> text, results as user turns, nothing else changed
    assert [m["role"] for m in messages] == [
        "system",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert messages[3]["content"] == (
        'Let me take a look with a CT.\n\n<tool_call>\n{"name": "ct", "arguments": {"region": "chest", '
        '"contrast": "yes"}}\n</tool_call>'
    )
    assert messages[4]["content"].startswith("The CT scan of the chest shows:")
    config = sft.compose(sft.overrides(*sft.parse(argv)[:1], sft.sft_recipes()["medexagent"], data, None))
    assert (config.optim.lr, config.optim.lr_scheduler_type, config.optim.lr_warmup_steps_ratio) == (
        2e-5,
        "cosine",
        0.05,
    )
    assert (config.data.train_batch_size, config.data.micro_batch_size_per_gpu) == (8, 2)  # 2 x 2 per GPU
    assert (config.data.max_length, config.trainer.total_epochs, config.model.lora_rank) == (4096, 1, 0)


def test_traj_to_sft_output_trains_through_the_same_script(checkpoint, tmp_path):
    record = {
        "id": "train-00001",
        "reward": 1.0,
        "messages": [
            {"role": "system", "content": "You are a physician."},
            {
                "role": "assistant",
                "content": "A blood count first.",
                "tool_calls": [
                    {"id": "c0", "type": "function", "function": {"name": "cbc", "arguments": "{}"}}
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "c0",
                "name": "cbc",
                "content": [{"type": "text", "text": "WBC 15"}],
            },
            {"role": "assistant", "content": "[DIAGNOSIS: pneumonia]"},
        ],
    }
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "trajectories.jsonl").write_text(json.dumps(record) + "\n")
    assert write_sft(tmp_path / "run", tmp_path / "sft.parquet") == 1
    script = [str(REPO / "scripts" / "train_sft.sh"), "--recipe", "medexagent", "--model", str(checkpoint)]
    done = subprocess.run(
        [*script, "--data", str(tmp_path / "sft.parquet"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1 conversations through verl's MultiTurnSFTDataset" in done.stdout
    (row,) = pq.read_table(tmp_path / "sft.verl_sft.parquet").to_pylist()
    assert [m["role"] for m in row["messages"]] == ["system", "assistant", "user", "assistant"]
    assert '<tool_call>\n{"name": "cbc", "arguments": {}}\n</tool_call>' in row["messages"][1]["content"]


def test_a_template_verl_cannot_split_by_turn_is_refused_naming_the_option(tmp_path, capsys, qwen3):
    model = tmp_path / "qwen3"
    shutil.copytree(qwen3, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen3ForCausalLM"]}))
    (tmp_path / "train.jsonl").write_text(json.dumps(RECORD) + "\n")
    argv = [
        "--recipe",
        "medexagent",
        "--model",
        str(model),
        "--data",
        str(tmp_path / "train.jsonl"),
        "--dry-run",
    ]
    assert sft.main(argv) == 2
    assert "ignore_input_ids_mismatch=True" in capsys.readouterr().err
