"""Issue 30's multi-node rehearsal: a local Ray cluster of two nodes on this machine (`ray.cluster_utils`),
started without any CASE_ENV_* variable, so its workers see only what a job forwards, as on a real cluster
where the launcher's shell is on one node. verl forwards a fixed list of variables to its workers
(trainer/constants_ppo.py); the launcher passes the server's URL and token through the job's runtime
environment, and preflight calls the server with CaseTool from a task pinned to every node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ray.util import get_node_ip_address

from case_env.bench.process import ServerProcess, free_port
from case_env.verl.cluster import NodeReport
from case_env.verl.preflight import printable
from tests.test_train_preflight import table
from tests.verl_rows import REPO, build_bank

TOKEN = "rehearsal-token-0123456789"


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    clean = {k: v for k, v in os.environ.items() if not k.startswith("CASE_ENV_") and k != "RAY_ADDRESS"}
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(clean)
    try:  # the raylets, and every worker they start, inherit this environment
        nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 1})
        nodes.add_node(num_cpus=1, num_gpus=1)  # declared, not real: Ray schedules by the count
        nodes.wait_for_nodes()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    yield nodes
    nodes.shutdown()


@pytest.fixture(scope="module")
def bank(dataset, tmp_path_factory):
    return build_bank(dataset, tmp_path_factory.mktemp("bank"))


@pytest.fixture(scope="module")
def exposed_server(dataset, tmp_path_factory):
    """A server bound beyond loopback, with a token, as a lab runs it for a multi-node job."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {"CASE_ENV_HOST": "0.0.0.0", "CASE_ENV_TOKEN": TOKEN, "CASE_ENV_DATA_ROOT": str(dataset)}
    server = ServerProcess(log, env).start()
    yield f"http://{get_node_ip_address()}:{server.port}"
    server.stop()


# Each probe joins the cluster from a child process: a Ray driver started and shut down more than once in
# the pytest process leaves core-worker threads behind that crash the interpreter at exit (ray-project/ray
# #31145: "Segfaults when restarting Ray multiple times in unit tests"), which CI met as a segfault after
# every test had passed.
_PROBE = """
import dataclasses, json, sys
from case_env.verl.cluster import probe_nodes
args = json.loads(sys.argv[1])
print(json.dumps([dataclasses.asdict(r) for r in probe_nodes(*args)]))
"""


def probe(cluster, bank: Path, env_vars: dict[str, str], patient: str) -> list[NodeReport]:
    yaml = str(REPO / "configs/verl/imaging.yaml")
    paths = [str(bank / "train.parquet"), yaml]
    args = [cluster.address, env_vars, paths, yaml, "list_visits", {"patient_id": patient}, {}]
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(args)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [NodeReport(**r) for r in json.loads(done.stdout.splitlines()[-1])]


def test_a_case_tool_on_the_second_node_reaches_the_server_only_through_the_forwarded_variables(
    cluster, bank, exposed_server
):
    patient = "case0001"
    reports = probe(cluster, bank, {"CASE_ENV_URL": exposed_server, "CASE_ENV_TOKEN": TOKEN}, patient)
    assert len(reports) == 2 and sum(r.local for r in reports) == 1
    second = next(r for r in reports if not r.local)
    assert (second.url, second.token, second.missing) == (exposed_server, True, [])
    assert second.health == "200" and second.call == "ok" and second.reached, second.text
    assert second.text.startswith("2 visit(s).\nbaseline (")  # list_visits answered for the patient
    # what a worker on that node sees when nothing is forwarded (verl's own list has no CASE_ENV_*):
    # the tool YAML's default, loopback on that node, where nothing listens
    bare = next(r for r in probe(cluster, bank, {}, patient) if not r.local)
    assert bare.url is None and not bare.token and not bare.reached
    # the URL alone: the server refuses a call without the token
    no_token = next(r for r in probe(cluster, bank, {"CASE_ENV_URL": exposed_server}, patient) if not r.local)
    assert no_token.health == "200" and no_token.call == "http_401" and not no_token.reached


def preflight(cluster, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "case_env.cli", "train", "preflight", *argv],
        env={**os.environ, "RAY_ADDRESS": cluster.address, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_preflight_on_two_nodes_starts_the_server_beyond_loopback_and_calls_it_from_both(
    cluster, bank, dataset, qwen2_5_vl, tmp_path
):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    port = free_port()
    result = preflight(
        cluster,
        *("--model", str(qwen2_5_vl), "--data", str(bank), "--data-root", str(dataset)),
        *("--server-url", f"http://127.0.0.1:{port}", "--server-host", "0.0.0.0"),
        *("--token-file", str(token_file), "--nodes", "2", "--gpus", "1"),
        *("--checkpoint-dir", str(tmp_path / "ckpt")),
        env={"CASE_ENV_TOKEN": ""},
    )
    checks = table(result.stdout)
    url = f"http://{get_node_ip_address()}:{port}"
    status, detail = checks["server from every node"]
    assert status == "pass", detail
    assert detail.startswith(
        f"2 nodes called {url} through CaseTool with the job's environment and the token:"
    )
    assert detail.count(" ok ") == 2 and "(here)" in detail and "verl prints it" not in detail
    assert checks["served tools"][0] == "pass" and checks["GPUs"][0] == "pass"
    assert (
        checks["chat template"][0] == "pass"
        and "case-env's qwen2_5_vl template" in checks["chat template"][1]
    )
    # this machine has no inference engine: the one check that cannot pass here
    assert [name for name, (status, _) in checks.items() if status == "FAIL"] == ["rollout engine"]
    assert result.returncode == 2 and "preflight failed: nothing was started" in result.stderr


def test_preflight_refuses_a_loopback_server_with_other_nodes_and_a_template_without_tools(
    cluster, bank, dataset, qwen2_5_vl, tmp_path
):
    result = preflight(
        cluster,
        *("--model", str(qwen2_5_vl), "--data", str(bank), "--data-root", str(dataset)),
        *("--server-url", f"http://127.0.0.1:{free_port()}", "--chat-template", "model"),
        *("--nodes", "2", "--gpus", "1", "--checkpoint-dir", str(tmp_path / "ckpt")),
        env={"CASE_ENV_TOKEN": TOKEN},
    )
    checks = table(result.stdout)
    status, detail = checks["server from every node"]
    assert (
        status == "FAIL"
        and "reaches only the machine calling it, and 1 other node(s) would each call their own" in detail
    )
    assert "fix: --server-host 0.0.0.0 with CASE_ENV_TOKEN" in detail
    status, detail = checks["chat template"]
    assert status == "FAIL" and "renders no tool schemas" in detail
    assert "fix: --chat-template shipped (case-env's for Qwen2.5-VL, Qwen3-VL, Qwen3)" in detail
    assert result.returncode == 2


def test_the_printed_config_never_shows_the_token(bank, monkeypatch):
    from case_env.verl import grpo

    monkeypatch.setenv("CASE_ENV_TOKEN", TOKEN)
    run = grpo.prepare(["--model", "m", "--data", str(bank)])
    env_vars = run.config.ray_kwargs.ray_init.runtime_env.env_vars
    assert env_vars.CASE_ENV_TOKEN == TOKEN and env_vars.CASE_ENV_URL == "http://127.0.0.1:8000"
    assert TOKEN not in printable(run.config) and "CASE_ENV_TOKEN: '***'" in printable(run.config)


# OPSD on the cluster: verl's agent loop manager of the legacy trainer, built by the class the launcher names
# (`PrivilegedAgentLoops`), starts its workers as Ray actors round-robin over both nodes; they play rows
# against the server with a scripted model and ask a scripted teacher, which records what it was sent.
_OPSD = """
import json, sys
import ray
from omegaconf import OmegaConf
from case_env.verl import launch, options
from case_env.verl.distill import HEADING, PrivilegedAgentLoops
from case_env.verl.offline import ScriptedModel
from tests.test_opsd import ScriptedTeacher, batch_of, batch_policy, response_view

address, url, token, bank, model = sys.argv[1:6]
args, extra = options.parse(["--recipe", "case", "--model", model, "--data", bank, "--gpus", "2", "--nodes", "2",
                            "--teacher-gpus", "1", "trainer.use_v1=False", "actor_rollout_ref.rollout.agent.num_workers=2"])
args.tool_config = launch.bank_tool_config(launch.Path(bank))
env_vars = {"CASE_ENV_URL": url, "CASE_ENV_TOKEN": token}
config = launch.compose(launch.Plan(args, extra, env_vars=env_vars).overrides())
ray.init(address=address, runtime_env={"env_vars": env_vars})

@ray.remote(num_cpus=0)
class Sent:
    def __init__(self):
        self.seen = []
    def add(self, node, sequence):
        self.seen.append((node, sequence))
    def all(self):
        return self.seen

class Teacher(ScriptedTeacher):
    def __init__(self, sink):
        super().__init__()
        self.sink = sink
    async def generate(self, request_id, *, prompt_ids, sampling_params, **kw):
        await self.sink.add.remote(ray.get_runtime_context().get_node_id(), list(prompt_ids))
        return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kw)

from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(model)
batch, items = batch_of(config, tokenizer, per_source=2)
sink = Sent.remote()
manager = PrivilegedAgentLoops.create(
    config=config, llm_client=ScriptedModel(tokenizer, batch_policy(items)), teacher_client={"default": Teacher(sink)}
)
out = manager.generate_sequences(batch)
seen = ray.get(sink.all.remote())
ids = response_view(out, "teacher_ids")
aligned = []
for i in range(len(items)):
    width = out.batch["prompts"].shape[1]
    n = int(out.batch["attention_mask"][i, width:].sum())
    aligned.append(bool((ids[i, :n].long() == out.batch["responses"][i, :n]).all()))
privileged = sum(HEADING in tokenizer.decode(sequence) for _node, sequence in seen)
insights = sum(any(item["extra_info"]["teacher_insight"] in tokenizer.decode(s) for _n, s in seen) for item in items)
print(json.dumps({"rows": len(items), "sent": len(seen), "nodes": len({n for n, _ in seen}),
                  "privileged": privileged, "insights": insights, "aligned": aligned,
                  "workers": type(manager).__mro__[1].__name__}))
ray.shutdown()
"""


def on_cluster(script: str, *argv: str) -> dict:
    """`script` run as a driver of the cluster's job; the JSON line it prints last."""
    done = subprocess.run(
        [sys.executable, "-c", script, *argv],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith("{")))


def test_opsd_workers_on_two_nodes_send_the_teacher_each_rows_privileged_prompt(
    cluster, bank, exposed_server, checkpoint
):
    result = on_cluster(_OPSD, cluster.address, exposed_server, TOKEN, str(bank), str(checkpoint))
    assert result["rows"] == result["sent"] == result["privileged"] == result["insights"] == 4
    assert result["nodes"] == 2  # one worker on each node, each asked the teacher
    assert result["aligned"] == [True] * 4 and result["workers"] == "AgentLoopManager"


# The job's runtime environment as the launcher composes it, on the two-node cluster: every worker, on either
# node, knows the trainer mode the config names (verl builds its trainer in such a worker).
_TRAINER = """
import json, sys
import ray
from case_env.verl import grpo

address, bank = sys.argv[1:3]
run = grpo.prepare(["--model", "m", "--data", bank, "--dry-run"])
runtime_env = {"worker_process_setup_hook": run.config.ray_kwargs.ray_init.runtime_env.worker_process_setup_hook}
ray.init(address=address, runtime_env=runtime_env)

@ray.remote(num_cpus=0, scheduling_strategy="SPREAD")
def mode(name):
    from verl.trainer.ppo.v1 import PPOTrainerSync, get_trainer_cls
    trainer = get_trainer_cls(name)
    return [ray.get_runtime_context().get_node_id(), issubclass(trainer, PPOTrainerSync),
            "_compute_metrics" in vars(trainer)]

found = ray.get([mode.remote(run.config.trainer.v1.trainer_mode) for _ in range(4)])
print(json.dumps({"nodes": len({f[0] for f in found}), "found": [f[1:] for f in found]}))
ray.shutdown()
"""


def test_the_trainer_that_logs_the_rewards_keys_is_known_to_every_worker_of_the_job(cluster, bank):
    result = on_cluster(_TRAINER, cluster.address, str(bank))
    assert result["found"] == [[True, True]] * 4 and result["nodes"] == 2
