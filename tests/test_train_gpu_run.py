"""A first GPU run that cannot train wrong in silence: what a verl engineer found reading the launch path
against verl 0.9.1, each reproduced with the launcher's own composition and verl's real classes on CPU
(`ToolAgentLoop`, its tool parser, `CaseTool` against a live server). Numbered as the findings."""

from __future__ import annotations

import asyncio
import json
import types
from pathlib import Path

import pytest
from transformers import AutoTokenizer
from verl.tools.tool_registry import load_all_tools

from case_env.core.calls import call_text
from case_env.verl import checks, grpo, launch, loop, options, steps
from case_env.verl.offline import ScriptedModel, loop_config, make_loop, run_row
from case_env.verl.tool import TEXT_ONLY
from tests.server_harness import live_server
from tests.verl_rows import build_bank, rows


@pytest.fixture(scope="module")
def bank(dataset, tmp_path_factory):
    return build_bank(dataset, tmp_path_factory.mktemp("bank"))


@pytest.fixture(scope="module")
def server(dataset, tmp_path_factory):
    with live_server(dataset, tmp_path_factory.mktemp("gpu-run-server")) as live:
        yield live


def dry(*argv: str) -> tuple:
    run = grpo.prepare([*argv, "--dry-run"])
    return run, {c.name: c for c in run.check(live=False)}


def played(
    bank, tokenizer, script: list[str], monkeypatch, server, retries: int | None = None, **env
) -> tuple:
    """One radiologist row (its tools draw images) played by `script` through the launcher's `tool_agent` loop
    (verl's ToolAgentLoop), the tools loaded from the bank's YAML under `env` (as verl's workers get the
    launcher's variables)."""
    monkeypatch.setenv("CASE_ENV_URL", server.url)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    item = next(i for i in rows(bank, 1) if i["data_source"] == "medpanel_v2_opsd")
    tools = load_all_tools(
        tool_config_path=str(launch.bank_tool_config(bank, dry_run=True)), function_tool_path=None
    )
    for tool in tools if retries is not None else ():
        tool.settings = tool.settings.model_copy(update={"retries": retries})

    async def go():
        model = ScriptedModel(tokenizer, lambda text, images, turn: script[turn])
        loop = make_loop(tools, model, processor=None, config=loop_config(max_turns=len(script)))
        return await run_row(loop, item), model

    return asyncio.run(go())


RENDER = {"visit": "baseline", "sequence": "water", "plane": "axial"}


def test_1_a_text_model_on_the_imaging_bank_reads_its_slices_as_text(bank, qwen3, server, monkeypatch):
    """verl raises on a tool's image for a model without a processor, and its trainer drops the trajectory:
    the launcher tells the workers' tools to answer such a model in text, and the preflight says so."""
    run, found = dry("--model", str(qwen3), "--data", str(bank))
    assert run.plan.env_vars["CASE_ENV_TOOL_IMAGES"] == "false"
    assert found["tool images"].status == checks.PASS and "text" in found["tool images"].detail
    assert "CASE_ENV_TOOL_IMAGES" in " ".join(run.plan.overrides())  # to every worker, through Ray's env
    # without the model's files the check cannot tell, and names the fix
    _, unknown = dry("--model", "someone/unknown-model", "--data", str(bank))
    assert unknown["tool images"].status == checks.UNVERIFIED
    assert "CASE_ENV_TOOL_IMAGES=false" in unknown["tool images"].fix
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3))
    script = [call_text("render_slice", RENDER), "<answer>A</answer>"]
    with pytest.raises(ValueError, match="Multimedia data can only be processed by `processor`"):
        played(bank, tokenizer, script, monkeypatch, server, CASE_ENV_TOOL_IMAGES="true")  # as before
    assert loop._TALLIES[loop.MAX_FAILED_ROLLOUTS].recent[-1] is True  # item 2: a loop that raised is counted
    images = run.plan.env_vars["CASE_ENV_TOOL_IMAGES"]
    output, model = played(bank, tokenizer, script, monkeypatch, server, CASE_ENV_TOOL_IMAGES=images)
    assert TEXT_ONLY in model.prompts[1] and output.extra_fields["case_env_tool_calls"][0]["status"] == "ok"


def test_5_every_call_of_a_turn_runs(bank, qwen3, server, monkeypatch):
    """verl ran the first call of a turn and dropped the rest without a word (max_parallel_calls=1)."""
    run, _ = dry("--model", str(qwen3), "--data", str(bank))
    parallel = run.config.actor_rollout_ref.rollout.multi_turn.max_parallel_calls
    assert parallel == launch.PARALLEL_CALLS > 1
    assert launch.concurrency(run.args) == run.args.batch_size * run.args.group_size * parallel
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3))
    both = "\n".join(call_text("get_clinical_context", {"section": s}) for s in ("demographics", "history"))
    output, model = played(
        bank, tokenizer, [both, "<answer>A</answer>"], monkeypatch, server, CASE_ENV_TOOL_IMAGES="false"
    )
    calls = output.extra_fields["case_env_tool_calls"]
    assert [c["arguments"]["section"] for c in calls] == ["demographics", "history"]
    assert model.prompts[1].count("<tool_response>") == 2
    assert json.dumps(calls)  # recorded as the reward reads them


def test_3_a_run_never_resumes_another_runs_checkpoints_silently(bank, tmp_path):
    """The checkpoint folder depended on the recipe alone and resume was automatic: another model or bank
    loaded the last run's weights; step folders were read where verl reads its tracker file."""
    folder = tmp_path / "ckpt"
    run, found = dry("--model", "org/model-a", "--data", str(bank), "--checkpoint-dir", str(folder))
    assert "starts afresh (no checkpoint yet)" in found["checkpoints"].detail
    assert dry("--model", "org/model-b", "--data", str(bank))[0].args.checkpoint_dir.name.endswith(
        f"model-b-{bank.name}"
    )  # by default another model has its own folder
    (folder / "global_step_40").mkdir(parents=True)
    found = dry("--model", "org/model-a", "--data", str(bank), "--checkpoint-dir", str(folder))[1]
    assert "no latest_checkpointed_iteration.txt" in found["checkpoints"].detail  # verl starts afresh
    (folder / "latest_checkpointed_iteration.txt").write_text("40")
    launch.record_identity(run.args)  # what the launcher writes before verl starts
    found = dry("--model", "org/model-a", "--data", str(bank), "--checkpoint-dir", str(folder))[1]
    assert found["checkpoints"].status == checks.FAIL  # the planned run is shorter than 40 steps
    assert "resumes from global_step_40 of a run planned at ~" in found["checkpoints"].detail
    (folder / "latest_checkpointed_iteration.txt").write_text("1")
    ours = dry("--model", "org/model-a", "--data", str(bank), "--checkpoint-dir", str(folder))[1]
    assert (
        ours["checkpoints"].status == checks.PASS
        and "resumes from global_step_1" in ours["checkpoints"].detail
    )
    theirs = dry("--model", "org/model-b", "--data", str(bank), "--checkpoint-dir", str(folder))[1][
        "checkpoints"
    ]
    assert theirs.status == checks.FAIL and "of another run (model 'org/model-a'" in theirs.detail
    assert "--checkpoint-dir" in theirs.fix


def test_8_no_checkpoints_holds_over_a_recipes_save_frequency(bank):
    run, found = dry("--model", "m", "--data", str(bank), "--recipe", "medexagent", "--no-checkpoints")
    assert run.config.trainer.save_freq == -1 and "none saved" in found["checkpoints"].detail


def test_4_a_judge_or_server_only_this_machine_reaches_is_refused_on_several_nodes(bank, monkeypatch):
    """verl spreads its reward workers over every node: a loopback judge answered the launcher's node, and
    the other nodes' rows fell back to rules one by one; `http://0.0.0.0` was taken as reachable."""
    monkeypatch.setenv("CASE_ENV_JUDGE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("CASE_ENV_TOKEN", "t" * 24)  # a server beyond loopback needs one
    recipe = ("--model", "m", "--data", str(bank), "--recipe", "case", "--batch-size", "48")
    two = dry(*recipe, "--nodes", "2", "--server-url", "http://10.0.0.1:8000")[1]["judge"]
    assert two.status == checks.FAIL and "reaches only the machine calling it" in two.detail
    assert "every node reaches" in two.fix
    assert dry(*recipe)[1]["judge"].status == checks.SKIPPED  # one node: the dry run asks no judge
    anywhere = dry("--model", "m", "--data", str(bank), "--nodes", "2", "--server-url", "http://0.0.0.0:8000")
    nodes = anywhere[1]["server from every node"]
    assert nodes.status == checks.FAIL and "reaches only the machine calling it" in nodes.detail


def test_2_6_a_rollout_the_infrastructure_failed_is_kept_out_of_the_gradient_and_counted(
    bank, qwen3, monkeypatch
):
    """An unreachable server came back as an ordinary tool answer and entered GRPO as reward 0; a loop that
    raised was dropped without a count. Through the launcher's loop, such a trajectory's response is masked
    out, marked, and counted toward the threshold that stops the run."""
    run, _ = dry("--model", str(qwen3), "--data", str(bank), "--max-failed-rollouts", "0.1")
    loops = Path(run.config.actor_rollout_ref.rollout.agent.agent_loop_config_path).read_text()
    assert (
        "name: tool_agent\n  _target_: case_env.verl.loop.CaseToolAgentLoop\n  max_failed_rollouts: 0.1"
        in loops
    )
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3))
    script = [call_text("get_clinical_context", {"section": "history"}), "<answer>A</answer>"]
    nowhere = types.SimpleNamespace(url="http://127.0.0.1:9")  # nothing listens there
    output, _ = played(bank, tokenizer, script, monkeypatch, nowhere, retries=0, CASE_ENV_TOOL_IMAGES="false")
    assert output.extra_fields["case_env_tool_calls"][0]["infra_error"] is True
    assert output.extra_fields[loop.FAILED_FIELD] == 1 and set(output.response_mask) == {0}
    assert len(output.response_mask) == len(output.response_ids) > 0
    tally = loop.FailureTally(0.1, window=100, least=20)
    verdicts = [tally.add(i % 5 == 0) for i in range(40)]  # one in five failed: 20% > 10%
    assert verdicts[:19] == [None] * 19  # too few to judge
    assert verdicts[19] is not None and "4 of this worker's last 20 rollouts failed" in verdicts[19]
    assert loop.FailureTally(0.25).add(False) is None


def test_7_opsd_on_eight_gpus_runs_unpadded_out_of_the_box_and_its_fix_is_possible(bank):
    """`--recipe case` on 8 GPUs padded every step (6 student GPUs), and the fix it named (8 student GPUs) left
    the teacher none."""
    run, found = dry("--model", "m", "--data", str(bank), "--recipe", "case", "--gpus", "8")
    assert run.args.teacher_gpus == 4 and run.config.trainer.n_gpus_per_node == 4  # 512 sequences over 4
    assert found["batches"].status == checks.PASS
    _, padded = dry(
        "--model", "m", "--data", str(bank), "--recipe", "case", "--gpus", "8", "--teacher-gpus", "2"
    )
    fix = padded["batches"].fix
    assert padded["batches"].status == checks.FAIL and "--teacher-gpus 4 (4 student GPU(s) per node)" in fix
    for gpus in ("6", "8"):  # every teacher count the fix names leaves it one GPU or more, and passes
        case = ("--model", "m", "--data", str(bank), "--recipe", "case", "--gpus", gpus, "--batch-size", "48")
        named = dry(*case, "--teacher-gpus", "1")[1]["batches"].fix.split("--teacher-gpus ")
        if len(named) > 1:
            teacher = named[1].split(" ")[0]
            assert (
                int(teacher) >= 1
                and dry(*case, "--teacher-gpus", teacher)[1]["batches"].status == checks.PASS
            )


@pytest.fixture(scope="module")
def clinic_bank(tmp_path_factory):
    from case_env.core.bank import write
    from case_env.envs.clinic.bank import build as build_clinic
    from case_env.envs.clinic.noise import NoiseConfig
    from case_env.envs.clinic.synth import make_cases

    folder = tmp_path_factory.mktemp("clinic-bank")
    write(build_clinic(make_cases(30, 0), 0, (0.8, 0.1, 0.1), NoiseConfig()), folder, {"env": "clinic"})
    return folder


@pytest.mark.parametrize("recipe", sorted(options.recipes()))
def test_every_recipes_dry_run_says_its_updates_what_it_logs_and_where_it_resumes(
    recipe, bank, clinic_bank, monkeypatch, tmp_path
):
    monkeypatch.setenv("CASE_ENV_IMAGING_RUBRIC_GRADER", "rules")  # no judge here
    data = clinic_bank if recipe == "medexagent" else bank
    argv = [
        "--model",
        "m",
        "--data",
        str(data),
        "--recipe",
        recipe,
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
    ]
    found = dry(*argv, "--batch-size", "16")[1]
    assert "updates of" in found["batches"].detail  # updates per step
    logged = found["logged per step"]
    assert (
        logged.status == checks.PASS
        and "each step: the reward (critic/score/mean) and its keys" in logged.detail
    )
    assert "reward/<key>/mean (acc, format_ok, judge_fallback, infra_error, calls_dropped)" in logged.detail
    assert "starts afresh (no checkpoint yet)" in found["checkpoints"].detail  # where it resumes from


def test_8_each_step_logs_the_rewards_keys_as_means(bank):
    """V1 logged a training step's score only: the trainer mode the launcher names adds the reward's numeric
    keys, read from each trajectory's extra fields as verl's agent-loop workers store them."""
    run, _ = dry("--model", "m", "--data", str(bank))  # verl validated the config
    assert run.config.trainer.v1.trainer_mode == steps.MODE
    assert run.config.ray_kwargs.ray_init.runtime_env.worker_process_setup_hook == "case_env.verl.steps.setup"
    trajectories = [
        {"reward_extra_info": {"score": 1.0, "acc": 1.0, "format_ok": True, "infra_error": 0.0, "pred": "A"}},
        {"reward_extra_info": {"score": 0.0, "acc": 0.0, "format_ok": False, "infra_error": 1.0, "pred": ""}},
        {"reward_extra_info": {"acc": 1.0, "judge_fallback": 1.0, "rubric": float("nan")}},
        {},  # a trajectory without reward keys
    ]
    assert steps.means(trajectories) == {
        "reward/acc/mean": 2 / 3,
        "reward/format_ok/mean": 0.5,
        "reward/infra_error/mean": 0.5,
        "reward/judge_fallback/mean": 1.0,
    }
    # item 2: a step of 2 prompts x 4 samples that holds these 4 trajectories lost 4 to loops that raised
    assert steps.step_metrics(trajectories, 8)["rollouts/dropped"] == 4.0
    assert steps.step_metrics(trajectories, 4)["rollouts/dropped"] == 0.0


def _mixed(folder: Path, *banks: Path) -> Path:
    """One bank of the rows of several: each split the concatenation of theirs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    for split in ("train", "val"):
        tables = [pq.read_table(b / f"{split}.parquet") for b in banks if (b / f"{split}.parquet").is_file()]
        pq.write_table(pa.concat_tables(tables), folder / f"{split}.parquet")
    return folder


def test_environments_mix_in_one_run_when_their_turn_limits_agree(bank, clinic_bank, qwen3, tmp_path):
    """A bank of imaging and case-reasoning rows: one tool YAML of both environments' tools (verl offers each
    row its own by `tool_selection`), one row of each data source played through verl's loop by the chat
    template check; a bank mixing the clinic (MedExAgent's 20 assistant / 15 user turns) with the imaging
    environment (8 / 8) is refused with the reason, since verl's turn limits are one per run."""
    from tests.test_casereason import case_bank

    reasoning = case_bank(tmp_path / "casereason", 6)
    (reasoning / "val.parquet").unlink(missing_ok=True)
    mixed = _mixed(tmp_path / "mixed", bank, reasoning)
    run, found = dry("--model", str(qwen3), "--data", str(mixed))
    assert run.envs == ["casereason", "imaging"]
    tools = {
        t.name for t in load_all_tools(tool_config_path=str(run.args.tool_config), function_tool_path=None)
    }
    assert {"render_slice", "submit_diagnosis"} <= tools
    template = found["chat template"]
    assert template.status == checks.PASS and "data sources" in template.detail
    with pytest.raises(launch.RunRefusedError, match="needs verl's V1 trainer"):
        dry("--model", "m", "--data", str(mixed), "trainer.use_v1=False")
    with pytest.raises(launch.RunRefusedError, match="train each environment on its own bank") as refused:
        dry("--model", "m", "--data", str(_mixed(tmp_path / "clinic-imaging", bank, clinic_bank)))
    assert "clinic: 20 assistant turns, 15 user turns" in str(refused.value)
    assert "imaging: 8 assistant turns, 8 user turns, 2048 tool-text characters" in str(refused.value)
