"""The clinic environment on the live server, next to the imaging patients: ask_patient and order_exam over
HTTP with the episode context, strict exam matching, server-side scope, the LLM patient with its cache and
fallback, and `case-env eval` on clinic banks, whose figures are the issue's acceptance test."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from case_env.envs.clinic.cases import read_csv
from case_env.envs.clinic.noise import NoiseConfig, plan_noise, told_units
from case_env.envs.clinic.synth import make_cases, write_csv
from tests.chat_stub import ScriptedChat
from tests.server_harness import live_server, serve_app

CASES = 60


@contextmanager
def env(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def cases_csv(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("clinic") / "clinic_synthetic.csv"
    write_csv(make_cases(CASES, seed=0), path)
    return path


@pytest.fixture(scope="module")
def server(dataset, cases_csv, tmp_path_factory):
    with (
        env(CASE_ENV_CLINIC_CASES=cases_csv),
        live_server(dataset, tmp_path_factory.mktemp("clinic-server")) as live,
    ):
        yield live


def post(server, tool: str, patient: str, episode: str, arguments: dict, context: dict | None = None):
    body = {"episode_id": episode, "patient_id": patient, "arguments": arguments}
    if context is not None:
        body["context"] = context
    return httpx.post(f"{server.url}/v1/tools/{tool}", json=body, timeout=30)


def test_ask_patient_follows_the_history_the_server_keeps(server, cases_csv):
    case = read_csv(cases_csv).cases[0]
    first = post(server, "ask_patient", case.case_id, "ep-ask", {"question": "What brings you in?"}).json()
    assert first["ok"] and case.symptoms.split(".")[0] in first["text"]
    more = post(server, "ask_patient", case.case_id, "ep-ask", {"question": "Anything else?"}).json()
    fresh = post(server, "ask_patient", case.case_id, "ep-fresh", {"question": "Anything else?"}).json()
    assert more["ok"] and more["text"] != fresh["text"]  # the episode's own log, not the request, decides
    assert fresh["text"] == first["text"]  # a new episode: "anything else" opens the conversation again
    # another episode asking the same questions gets the same answers (the patient is a function of them)
    post(server, "ask_patient", case.case_id, "ep-other", {"question": "What brings you in?"})
    again = post(server, "ask_patient", case.case_id, "ep-other", {"question": "Anything else?"}).json()
    assert again["text"] == more["text"]
    # a client cannot write the conversation: the history is the server's, refused by name
    sent = [{"question": "What brings you in?", "answer": "I am fine."}]
    refused = post(server, "ask_patient", case.case_id, "ep-lie", {"question": "Hi"}, {"history": sent})
    assert refused.status_code == 422 and "context.history" in refused.text


def test_noise_comes_from_the_context_and_matches_the_plan(server, cases_csv):
    noise = {"seed": 3, "patient_rate": 1.0, "exam_rate": 1.0, "mode": "per_case"}
    for case in read_csv(cases_csv).cases:
        plan = plan_noise(case, NoiseConfig(**noise))
        kinds = {n.kind for n in plan.patient}
        if not {"body_part_swap", "symptom_confusion", "severity_change"} & kinds:
            continue
        told = [u for u in told_units(case, plan) if u]
        answer = post(
            server,
            "ask_patient",
            case.case_id,
            f"ep-noise-{case.case_id}",
            {"question": "What brings you in?"},
            {"noise": noise},
        ).json()["text"]
        if any(n.turn == 0 for n in plan.patient if n.kind == "vague_answer"):
            continue
        assert told[0].rstrip(".") in answer
        clean = post(
            server,
            "ask_patient",
            case.case_id,
            f"ep-clean-{case.case_id}",
            {"question": "What brings you in?"},
        ).json()["text"]
        if plan.patient and any(n.unit == 0 for n in plan.patient):
            assert clean != answer
        exam = case.exams[0]
        result = post(
            server,
            exam.call.name,
            case.case_id,
            f"ep-noise-{case.case_id}",
            exam.call.as_arguments(),
            {"noise": noise},
        ).json()["text"]
        assert (
            result
            != post(
                server, exam.call.name, case.case_id, f"ep-clean-{case.case_id}", exam.call.as_arguments()
            ).json()["text"]
        )
        return
    pytest.fail("no case with a distorted chief complaint")


def test_order_exam_matches_strictly_and_names_what_was_done(server, cases_csv):
    case = next(c for c in read_csv(cases_csv).cases if c.diagnosis == "community-acquired pneumonia")
    xray = next(e for e in case.exams if e.call.name == "xray")
    done = post(server, "order_exam", case.case_id, "ep-exam", {"exam": "xray", "region": "chest"}).json()
    assert done["ok"] and done["text"] == f"X-ray (region chest) (cost low, discomfort low): {xray.findings}"
    for region in ("abdomen", "head", "pelvis"):
        other = post(server, "order_exam", case.case_id, "ep-exam", {"exam": "xray", "region": region}).json()
        assert other["ok"] and xray.findings not in other["text"]
        assert other["text"].endswith("no result. This exam is not part of this patient's work-up.")
        tool = post(server, "xray", case.case_id, "ep-exam", {"region": region}).json()
        assert (
            tool["ok"] and tool["text"] == "No significant findings."
        )  # MedExAgent's words, never the chest's
    assert post(server, "xray", case.case_id, "ep-exam", {"region": "Chest"}).json()["text"] == (
        f"The chest X-ray reveals: {xray.findings}"
    )
    bad = post(server, "order_exam", case.case_id, "ep-exam", {"exam": "xray"}).json()
    assert not bad["ok"] and bad["error"]["code"] == "invalid_arguments"
    assert (
        bad["text"] == "invalid order: xray needs region (one of head, neck, chest, abdomen, pelvis, spine, "
        "upper_extremity, lower_extremity, whole_body)"
    )
    wrong = post(server, "order_exam", case.case_id, "ep-exam", {"exam": "bmp", "region": "chest"}).json()
    assert wrong["text"] == "invalid order: bmp does not take region (it takes no parameters)"
    enum = post(server, "order_exam", case.case_id, "ep-exam", {"exam": "x-ray"}).json()
    assert not enum["ok"] and "exam must be one of xray, ct, mri" in enum["text"]


def test_environments_do_not_mix_and_scope_holds(server, cases_csv, dataset):
    case = read_csv(cases_csv).cases[1]
    imaging = post(server, "list_visits", case.case_id, "ep-mix", {}).json()
    assert not imaging["ok"] and imaging["error"]["code"] == "not_available"
    assert (
        imaging["text"] == "list_visits is an imaging tool; this case is a clinic case, not an imaging case"
    )
    clinic = post(server, "ask_patient", "case0001", "ep-mix-2", {"question": "hi"}).json()
    assert clinic["error"]["code"] == "not_available" and "not a clinic case" in clinic["text"]
    unknown = post(server, "examine", case.case_id, "ep-mix-3", {}).json()
    assert unknown["text"].startswith("unknown tool 'examine'; available tools: ask_patient, xray, ct, mri, ")
    other = read_csv(cases_csv).cases[2]
    assert post(server, "ask_patient", case.case_id, "ep-scope", {"question": "hi"}).status_code == 200
    refused = post(server, "ask_patient", other.case_id, "ep-scope", {"question": "hi"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "scope_violation"
    assert (
        post(server, "ask_patient", "clinic_synthetic-99999", "ep-x", {"question": "hi"}).status_code == 404
    )
    ready = httpx.get(f"{server.url}/readyz").json()
    assert ready["patients"] == 10 + CASES


def test_score_route_returns_the_clinic_components(server):
    completion = (
        '<tool_call>\n{"name": "order_exam", "arguments": {"exam": "cbc"}}\n</tool_call>\nuser\n'
        "<tool_response>\n...\n</tool_response>\n<answer>gout</answer>"
    )
    body = {
        "data_source": "clinic_synthetic",
        "solution_str": completion,
        "ground_truth": "Gout",
        "extra_info": {"clinic": {"exams": ["cbc()", 'arthrocentesis(joint="knee")']}},
    }
    reply = httpx.post(f"{server.url}/v1/score", json=body, timeout=10).json()
    # MedExAgent's reward: ToolRL (1/2 name Jaccard + 1 for cbc's parameters) / (1 + 1 + 2), the cbc free
    assert reply["score"] == pytest.approx(1.0 + 0.5 * (0.5 + 1.0) / 4, abs=1e-9)
    assert reply["acc"] == 1.0 and reply["pred"] == "gout" and reply["format_ok"]
    assert reply["env"] == "clinic"
    assert reply["components"]["exams"] == 1 and reply["components"]["exams_necessary"] == 2
    imaging = httpx.post(
        f"{server.url}/v1/score",
        json={"data_source": "vista3d_opsd", "ground_truth": "B", "solution_str": "<answer>B</answer>"},
        timeout=10,
    ).json()
    components = imaging.pop("components")
    assert imaging == {"env": "imaging", "score": 1.0, "acc": 1.0, "pred": "B", "format_ok": True}
    # CASE's rubric, unweighted: a bare letter cites nothing a tool returned
    assert components["rubric_by"] == "rules" and components["rubric"] == 0.0
    assert set(components) == {
        "rubric_values",
        "rubric_visits",
        "rubric_grounded",
        "rubric_follows",
        "rubric",
        "rubric_applicable",
        "rubric_by",
        "judge_fallback",
        "infra_error",
        "calls_dropped",
    }


@pytest.mark.parametrize(
    ("context", "problem"),
    [
        ({"history": "not a list"}, "history"),
        ({"noise": {"patient_rate": 2}}, "patient_rate"),
        ({"noise": {"seed": 1, "oops": 1}}, "oops"),
        ({"persona": "yes"}, "persona"),
        ({"ordered": ["xray"]}, "ordered"),
    ],
)
def test_a_malformed_context_is_refused_by_name(server, cases_csv, context, problem):
    case = read_csv(cases_csv).cases[0]
    reply = post(server, "ask_patient", case.case_id, "ep-bad", {"question": "hi"}, context)
    assert reply.status_code == 422 and problem in reply.text and "Traceback" not in reply.text


@contextmanager
def llm_patient(chat: ScriptedChat, dataset, cases_csv, tmp_path, **settings):
    """A server whose clinic patient is the scripted chat endpoint, with CASE_ENV_CLINIC_PATIENT_<settings>."""
    with serve_app(chat.app) as llm:
        patient = {f"CASE_ENV_CLINIC_PATIENT_{k}": v for k, v in settings.items()}
        with (
            env(CASE_ENV_CLINIC_CASES=cases_csv, CASE_ENV_CLINIC_PATIENT_URL=f"{llm.url}/v1", **patient),
            live_server(dataset, tmp_path) as server,
        ):
            yield server


def test_llm_patient_samples_afresh_falls_back_to_rules_and_never_sees_the_answer(
    dataset, cases_csv, tmp_path
):
    case = read_csv(cases_csv).cases[0]
    chat = ScriptedChat(lambda messages: "Oh, it's my chest, doctor. It hurts.")
    with llm_patient(chat, dataset, cases_csv, tmp_path, CACHE=tmp_path / "patient.sqlite") as server:
        question = {"question": "What brings you in?"}
        first = post(server, "ask_patient", case.case_id, "ep-llm", question, {"noise": {"seed": 1}}).json()
        second = post(
            server, "ask_patient", case.case_id, "ep-llm-2", question, {"noise": {"seed": 1}}
        ).json()
        assert first["text"] == second["text"] == "Oh, it's my chest, doctor. It hurts."
        # MedExAgent's patient samples every reply afresh: neither the server's response cache nor the LLM
        # cache answers the second
        assert len(chat.requests) == 2
        sent = chat.requests[0]
        assert sent["temperature"] == 0.7 and sent["messages"][-1] == {  # MedExAgent's patient temperature
            "role": "user",
            "content": "What brings you in?",
        }
        assert sent["max_tokens"] == 2048  # its interaction's budget
        prompt = sent["messages"][0]["content"]
        assert case.symptoms.split(".")[0] in prompt
        assert case.diagnosis not in prompt.lower() and all(e.findings not in prompt for e in case.exams)
        # another question in the episode, its history the server's: perspective swapped (the doctor is the
        # user)
        post(
            server, "ask_patient", case.case_id, "ep-llm", {"question": "Since when?"}, {"noise": {"seed": 1}}
        )
        assert [m["role"] for m in chat.requests[-1]["messages"]] == ["system", "user", "assistant", "user"]
        # it hears of every exam ordered (never its findings), where it was ordered
        for tool, arguments in (
            ("ct", {"region": "chest", "contrast": "yes"}),
            ("ask_patient", {"question": "What brings you in?"}),
            ("cbc", {}),
            ("ask_patient", {"question": "Any pain?"}),
        ):
            assert post(server, tool, case.case_id, "ep-ordered", arguments).json()["ok"], tool
        sent = chat.requests[-1]["messages"]
        assert [m["role"] for m in sent] == ["system", "user", "user", "assistant", "user", "user"]
        assert sent[1]["content"] == (
            "[The doctor has ordered CT scan (contrast yes, region chest). The results have been received.]"
        )
        assert "complete blood count" in sent[4]["content"] and sent[5]["content"] == "Any pain?"
    kept = ScriptedChat(lambda messages: "It started on Monday.")
    with llm_patient(kept, dataset, cases_csv, tmp_path / "kept", CACHE_REPLIES="1") as server:
        for episode in ("ep-k1", "ep-k2"):
            post(server, "ask_patient", case.case_id, episode, {"question": "Since when?"})
        assert len(kept.requests) == 1  # the option: one reply per conversation, shared by the group
    slow = ScriptedChat(lambda messages: "too late", delay_s=3.0)
    with llm_patient(slow, dataset, cases_csv, tmp_path / "slow", TIMEOUT_S="0.5") as server:
        answer = post(
            server, "ask_patient", case.case_id, "ep-slow", {"question": "What brings you in?"}
        ).json()
        assert answer["ok"] and case.symptoms.split(".")[0] in answer["text"]  # the rule-based patient


def _clinician_model(messages: list[dict]) -> dict:
    """The scripted clinician behind the chat protocol: its moves are rebuilt from the conversation. Its first
    reply is a tool call with broken JSON arguments, which the client must survive."""
    from case_env.core.policy import Observation
    from case_env.envs.clinic.baselines import Clinician

    if not any(m["role"] == "assistant" for m in messages):
        return {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "bad", "type": "function", "function": {"name": "ask_patient", "arguments": "{oops"}}
            ],
        }
    calls, moves = {}, []
    for m in messages:
        for c in m.get("tool_calls") or []:
            calls[c["id"]] = c["function"]
        if m["role"] == "tool" and m["tool_call_id"] != "bad":
            function = calls[m["tool_call_id"]]
            moves.append(Observation(function["name"], json.loads(function["arguments"]), m["content"]))
    prompt = "\n".join(m["content"] for m in messages[:2])
    move = Clinician(prompt).next_turn(moves)
    if move.call is None:
        return {"role": "assistant", "content": move.text}
    name, arguments = move.call
    call = {
        "id": f"c{len(moves)}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def test_openai_clinician_through_the_chat_protocol_matches_the_scripted_one(server, cases_csv, tmp_path):
    from case_env.core.bank import write
    from case_env.envs.clinic.bank import build
    from case_env.eval.openai_agent import ModelSettings
    from case_env.eval.runner import run_eval

    write(
        build(
            read_csv(cases_csv).cases,
            0,
            (1.0, 0.0, 0.0),
            NoiseConfig(seed=1, patient_rate=0.5, exam_rate=0.3),
            patient="ask_patient",  # the stub model asks through the tool
        ),
        tmp_path / "bank",
        {},
    )
    chat = ScriptedChat(_clinician_model)
    with serve_app(chat.app) as model_server:
        model = ModelSettings(base_url=f"{model_server.url}/v1", model="stub")
        served = run_eval(
            tmp_path / "bank",
            server.url,
            "openai",
            tmp_path / "openai",
            limit=12,
            model=model,
            progress=False,
        )
    scripted = run_eval(
        tmp_path / "bank", server.url, "clinician", tmp_path / "scripted", limit=12, progress=False
    )
    assert served["overall"] == scripted["overall"] and served["overall"]["n"] == 12
    offered = {t["function"]["name"] for t in chat.requests[0]["tools"]}
    assert "ask_patient" in offered and "order_exam" not in offered and len(offered) >= 7  # work-up + 5
    errors = [
        m
        for r in chat.requests
        for m in r["messages"][-1:]
        if m.get("content", "").startswith("Error: the arguments are not a valid JSON object")
    ]
    assert len(errors) == 12  # every conversation's broken call got an error reply and went on
    with pytest.raises(FileExistsError):
        run_eval(tmp_path / "bank", server.url, "clinician", tmp_path / "scripted", progress=False)
    resumed = run_eval(
        tmp_path / "bank",
        server.url,
        "clinician",
        tmp_path / "scripted",
        limit=12,
        resume=True,
        progress=False,
    )
    assert resumed == scripted


def test_eval_against_a_server_without_the_cases_says_so(server, tmp_path):
    from case_env.core.bank import write
    from case_env.envs.clinic.bank import build

    write(build(make_cases(3, 0, stem="elsewhere"), 0, (1.0, 0.0, 0.0), NoiseConfig()), tmp_path / "bank", {})
    cli = shutil.which("case-env") or str(Path(os.sys.executable).parent / "case-env")
    done = subprocess.run(
        [
            cli,
            "eval",
            "--bank",
            str(tmp_path / "bank"),
            "--server",
            server.url,
            "--agent",
            "clinician",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "error: the server has no case 'elsewhere-0000" in done.stderr and "--cases clinic=" in done.stderr


def _run(*args: str) -> str:
    cli = shutil.which("case-env") or str(Path(os.sys.executable).parent / "case-env")
    done = subprocess.run([cli, *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_eval_acceptance_scripted_clinician_beats_no_exam_and_noise_costs_accuracy(dataset, tmp_path):
    root = tmp_path / "root"
    _run("synth", "--env", "clinic", "--out", str(root), "--patients", "150", "--seed", "0")
    _run("bank", "build", "--env", "clinic", "--data-root", str(root), "--out", str(tmp_path / "clean"))
    _run(
        "bank",
        "build",
        "--env",
        "clinic",
        "--data-root",
        str(root),
        "--out",
        str(tmp_path / "noisy"),
        "--patient-noise",
        "1",
        "--exam-noise",
        "0.5",
    )
    assert "150 rows" not in _run("bank", "validate", str(tmp_path / "clean" / "train.parquet"))
    results = {}
    with env(CASE_ENV_CLINIC_CASES=root / "clinic"), live_server(dataset, tmp_path / "srv") as server:
        for bank in ("clean", "noisy"):
            for agent in ("clinician", "no-exam"):
                out = tmp_path / f"{bank}-{agent}"
                printed = _run(
                    "eval",
                    "--bank",
                    str(tmp_path / bank),
                    "--server",
                    server.url,
                    "--agent",
                    agent,
                    "--out",
                    str(out),
                    "--protocol",  # the banks' noise plans and personas (MedExAgent's protocols inject none)
                    "noisy",
                )
                assert re.search(r"overall\s+150\s", printed)
                results[bank, agent] = json.loads((out / "results.json").read_text())
    clean, noisy = results["clean", "clinician"]["overall"], results["noisy", "clinician"]["overall"]
    blind = results["clean", "no-exam"]["overall"]
    assert clean["accuracy_strict"] >= 0.9 and blind["accuracy_strict"] <= 0.75
    assert clean["accuracy_strict"] - blind["accuracy_strict"] >= 0.25  # examining pays
    assert blind["exams"] == 0 and blind["cost"] == 0 and clean["exams"] >= 1 and clean["cost"] > 0
    assert noisy["accuracy_strict"] <= clean["accuracy_strict"] - 0.03  # noise lowers accuracy measurably
    assert results["noisy", "no-exam"]["overall"]["accuracy_strict"] < blind["accuracy_strict"]
    noise = results["noisy", "clinician"]["by_noise"]
    assert {"patient:body_part_swap", "patient:omission", "exam:ambiguity", "any noise"} <= set(noise)
    assert results["clean", "clinician"]["by_noise"].keys() == {"clean", "no noise"}
    record = json.loads((tmp_path / "noisy-clinician" / "trajectories.jsonl").read_text().splitlines()[0])
    assert record["noise_plan"]["labels"] == record["noise"] and record["turns"] == record["tool_calls"] + 1
    _check_report_in_chromium(tmp_path / "clean-clinician" / "report.html", tmp_path)
    # the acceptance script's page: several runs, a summary row each and one plot first, the rest folded
    from case_env.core import registry
    from case_env.eval.report import write_report
    from tests.browser import assert_reads_at_a_glance

    (tmp_path / "all").mkdir()
    runs = [(f"{bank} {agent}", results[bank, agent]) for bank, agent in results]
    page = write_report(tmp_path / "all", registry.get("clinic"), runs, [])
    seen = assert_reads_at_a_glance(page, tmp_path)
    assert seen["images-ok"] == 1 and seen["plots"] == 1
    text = page.read_text()
    assert "<h1>case-env evaluation · " in text and "4 runs</h1>" in text
    summary = text.split("id='summary'", 1)[1].split("</table>", 1)[0]
    assert summary.count("<tr>") == 1 + len(runs)
    assert text.index("id='summary'") < text.index("class='plots'") < text.index("more tables</summary>")


def _check_report_in_chromium(page: Path, tmp_path: Path) -> None:
    from tests.browser import assert_reads_at_a_glance

    seen = assert_reads_at_a_glance(page, tmp_path)
    assert seen["images-ok"] == 1  # the cost-accuracy plot
    assert seen["table-rows"] == 2  # clinic_synthetic and overall


def test_exam_answers_are_shared_across_episodes_that_asked_different_questions(dataset, cases_csv, tmp_path):
    """An exam's result depends on the case, the exam and the noise assignment: the response cache keys on
    those alone, so a group's rollouts that asked the patient different things share one computed answer,
    and the case's noise plan is made once and kept for every call of every episode."""
    from case_env.envs.clinic import store

    made: list[str] = []
    real = store.plan_noise

    def counting(case, noise):
        made.append(case.case_id)
        return real(case, noise)

    case = read_csv(cases_csv).cases[0]
    exam = case.exams[0].call
    noise = {"seed": 3, "exam_rate": 1.0, "mode": "per_case"}
    with (
        env(CASE_ENV_CLINIC_CASES=cases_csv),
        pytest.MonkeyPatch.context() as patch,
        live_server(dataset, tmp_path) as server,
    ):
        patch.setattr(store, "plan_noise", counting)
        answers = []
        for n, question in enumerate(("What brings you in?", "Any fever?", "Since when?")):
            asked = post(
                server, "ask_patient", case.case_id, f"ep-{n}", {"question": question}, {"noise": noise}
            )
            assert asked.json()["ok"]  # each episode's history (the server's) differs from the others'
            answers.append(
                post(server, exam.name, case.case_id, f"ep-{n}", exam.as_arguments(), {"noise": noise}).json()
            )
        assert all(a["ok"] for a in answers) and len({a["text"] for a in answers}) == 1
        scraped = httpx.get(f"{server.url}/metrics", timeout=10).text
        hits = sum(
            float(line.rsplit(" ", 1)[1])
            for line in scraped.splitlines()
            if line.startswith("case_env_response_cache_total") and ('"hit"' in line or '"shared"' in line)
        )
        assert hits == 2  # the second and third episodes' exam: answered from the first's
        assert made == [case.case_id]  # one plan for the case, whatever was asked
        other = post(
            server, exam.name, case.case_id, "ep-9", exam.as_arguments(), {"noise": {**noise, "seed": 4}}
        )
        assert other.json()["ok"] and made == [case.case_id, case.case_id]  # another assignment, another plan


def test_a_steps_episodes_wait_on_the_patient_together_and_never_hold_up_other_calls(
    dataset, cases_csv, tmp_path
):
    """Episodes waiting on an LLM patient are awaited on the server's loop, not in its two text threads: 256
    episodes asking a 0.5 s patient at once go out 64 at a time (the endpoint's bound, reached and never
    passed), and an exam and an imaging call made meanwhile answer while they wait."""
    import asyncio
    import time

    from case_env.bench.standin import StandInProcess

    cases = read_csv(cases_csv).cases
    exam = cases[0].exams[0].call
    with (
        StandInProcess(latency_ms=500, reply="It began on Monday.") as model,
        env(
            CASE_ENV_CLINIC_CASES=cases_csv,
            CASE_ENV_CLINIC_PATIENT_URL=model.url,
            CASE_ENV_CLINIC_PATIENT_CONCURRENCY=64,
        ),
        live_server(dataset, tmp_path) as server,
    ):
        imaging_patient = "case0001"  # of the imaging dataset beside the clinic cases

        async def step() -> tuple[list[dict], float, list[tuple[str, float]]]:
            many = httpx.Limits(max_connections=1024)
            async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=many) as client:

                async def call(tool, patient, episode, arguments, context=None):
                    body = {"episode_id": episode, "patient_id": patient, "arguments": arguments}
                    if context is not None:
                        body["context"] = context
                    return (await client.post(f"/v1/tools/{tool}", json=body)).json()

                began = time.perf_counter()
                asks = [
                    asyncio.create_task(
                        call(
                            "ask_patient",
                            cases[n % len(cases)].case_id,
                            f"ep-{n}",
                            {"question": "Since when?"},
                        )
                    )
                    for n in range(256)
                ]
                await asyncio.sleep(0.3)
                others = []
                for tool, patient, arguments in (
                    (exam.name, cases[0].case_id, exam.as_arguments()),
                    ("list_visits", imaging_patient, {}),
                ):
                    answer = await call(tool, patient, f"other-{tool}", arguments)
                    assert answer["ok"], answer
                    others.append((tool, sum(not a.done() for a in asks)))
                answers = await asyncio.gather(*asks)
                return answers, time.perf_counter() - began, others

        answers, elapsed, others = asyncio.run(step())
        assert all(a["ok"] and a["text"] == "It began on Monday." for a in answers)
        assert model.stats()["peak_in_flight"] == 64 and model.stats()["requests"] == 256
        # answered while most of the step still waited on the patient
        assert all(waiting > 128 for _, waiting in others), others
        # four rounds of 0.5 s; the two text threads the patient used to block would need 64 s
        assert elapsed < 16, elapsed


def test_a_failing_patient_falls_back_to_the_rules_counted_in_metrics_and_the_episode_log(
    dataset, cases_csv, tmp_path
):
    from case_env.bench.standin import StandInProcess

    case = read_csv(cases_csv).cases[0]
    with (
        StandInProcess(failure_rate=1.0) as model,
        env(
            CASE_ENV_CLINIC_CASES=cases_csv,
            CASE_ENV_CLINIC_PATIENT_URL=model.url,
            CASE_ENV_CLINIC_PATIENT_RETRIES=1,
        ),
        live_server(dataset, tmp_path) as server,
    ):
        for n in range(3):
            answer = post(
                server, "ask_patient", case.case_id, f"ep-f{n}", {"question": "What brings you in?"}
            )
            assert answer.json()["ok"] and case.symptoms.split(".")[0] in answer.json()["text"]  # the rules'
        assert model.stats()["requests"] == 6  # each asked twice (one retry), every answer a 500
        scraped = httpx.get(f"{server.url}/metrics", timeout=10).text
        assert 'case_env_model_fallbacks_total{tool="ask_patient"} 3.0' in scraped
        assert f'case_env_model_requests{{endpoint="{model.url}",state="waiting"}} 0.0' in scraped
        logged = httpx.get(f"{server.url}/v1/episodes/ep-f0", timeout=10).json()
        assert logged["calls"][0]["fallback"].startswith("the LLM patient did not answer")


def test_a_replayed_patient_answers_from_the_recording_without_awaiting_a_model():
    """A replay server answers ask_patient from its book: the bound tool no longer awaits (its handler is
    the book's lookup), so the route runs it as any recorded tool."""
    from case_env.core import registry
    from case_env.core.tools import ToolContext, ToolResult, canonical_arguments
    from case_env.server.replay import ReplayBook

    spec = registry.get("clinic").tools["ask_patient"]
    assert spec.awaits
    args = spec.parse({"question": "Since when?"})
    book = ReplayBook(entries={("c1", "ask_patient", canonical_arguments(args)): ToolResult("Since Monday.")})
    bound = book.bind({"ask_patient": spec})["ask_patient"]
    assert bound.awaits is False and bound.run(ToolContext(None, "c1"), args).text == "Since Monday."
