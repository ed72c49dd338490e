"""`case-env eval` on a clinic bank: roll an agent through each case against a live server, score it with
the clinic reward, and summarise: strict and lenient accuracy, mean cost, exams, questions and turns per
case, accuracy by data source and by noise type, with a cost-accuracy plot in report.html.

A turn is one assistant message (every tool call, and the diagnosis), the same definition the imaging
eval uses. The runner sends each call the row's noise configuration and the episode's earlier exchanges,
exactly as the verl adapter does, so an evaluation sees the noise training saw. The trajectory file is the
run's state: `--resume` continues it, and results.json is recomputed from it.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import httpx
import pyarrow.parquet as pq
from tqdm import tqdm

from case_env.clinic.agents import Move, make_clinician
from case_env.clinic.reward import clinic_score
from case_env.eval import trajectory
from case_env.eval.bank import Item, bank_files, load_items
from case_env.eval.openai_agent import ModelSettings

AGENTS = ("clinician", "no-exam", "openai")
FILENAME = "trajectories.jsonl"


def bank_environment(bank: Path) -> str:
    """clinic, casereason or imaging: the environment of a bank's rows (reads only the data_source column)."""
    sources = {str(s) for path in bank_files(bank)
               for s in pq.read_table(path, columns=["data_source"]).column(0).to_pylist()}  # fmt: skip
    if sources and all(s.startswith("clinic_") for s in sources):
        return "clinic"
    return "casereason" if sources == {"casereason"} else "imaging"


class OpenAIClinician:
    """A model behind an OpenAI-compatible server, offered the row's tools; its first reply without a tool
    call is its diagnosis."""

    def __init__(self, prompt: list[dict], tools: list[dict], settings: ModelSettings, client):
        self.settings, self.client, self.tools = settings, client, tools
        self.messages = [dict(m) for m in prompt]
        self.pending: str | None = None

    def next_move(self, done: list[Move]) -> Move:
        if self.pending is not None and done:
            self.messages.append(
                {"role": "tool", "tool_call_id": self.pending, "content": done[-1].observation}
            )
            self.pending = None
        for _ in range(3):  # a reply with unreadable arguments gets an error and another chance
            reply = self.client.chat.completions.create(
                model=self.settings.model, messages=self.messages, tools=self.tools,
                temperature=self.settings.temperature, max_tokens=self.settings.max_tokens,
                timeout=self.settings.timeout_s).choices[0].message  # fmt: skip
            calls = reply.tool_calls or []
            self.messages.append({"role": "assistant", "content": reply.content or "",
                                  **({"tool_calls": [c.model_dump() for c in calls[:1]]} if calls else {})})  # fmt: skip
            if not calls:
                return Move(None, text=reply.content or "")
            try:
                arguments = json.loads(calls[0].function.arguments or "{}")
                assert isinstance(arguments, dict)
            except (ValueError, AssertionError):
                self.messages.append({"role": "tool", "tool_call_id": calls[0].id,
                                      "content": "Error: the arguments are not a valid JSON object."})  # fmt: skip
                continue
            self.pending = calls[0].id
            return Move(calls[0].function.name, arguments)
        return Move(None, text="")


def _post(client: httpx.Client, tool: str, body: dict) -> dict:
    for attempt in range(6):
        reply = client.post(f"/v1/tools/{tool}", json=body)
        if reply.status_code not in (429, 503, 504) or attempt == 5:
            break
        time.sleep(float(reply.headers.get("retry-after", "1")))
    if reply.status_code == 404:
        raise LookupError(f"the server has no case {body['patient_id']!r}: serve the bank's cases "
                          "(case-env serve --clinic-cases FILE, or <data root>/clinic/)")  # fmt: skip
    if reply.status_code != 200:
        reply.raise_for_status()
    return reply.json()


def run_case(client: httpx.Client, agent, item: Item, max_turns: int) -> tuple[list[Move], str]:
    """Play one case; returns the tool moves and the final message ("" when the turns ran out)."""
    create = item.extra["tools_kwargs"]["ask_patient"]["create_kwargs"]
    episode = f"clinic-{uuid.uuid4().hex}"
    history: list[dict] = []
    moves: list[Move] = []
    for _ in range(max_turns):
        move = agent.next_move(moves)
        if move.tool is None:
            return moves, move.text
        body = {"episode_id": episode, "patient_id": create["patient_id"], "arguments": move.arguments,
                "context": {"history": list(history), "noise": create.get("noise") or {}}}  # fmt: skip
        payload = _post(client, move.tool, body)
        ok = payload.get("ok", False)
        text = payload.get("text") or (payload.get("error") or {}).get("message", "")
        move.observation = text if ok else f"Error: {text}"
        if ok and move.tool == "ask_patient":
            history.append({"question": move.arguments.get("question", ""), "answer": text})
        moves.append(move)
    return moves, ""


def transcript(moves: list[Move], final: str) -> str:
    """The trajectory as verl decodes it: assistant turns with tool calls, tool responses, the answer."""
    parts = [f"{m.assistant_text()}\n<tool_response>\n{m.observation}\n</tool_response>" for m in moves]
    return "\n".join([*parts, final])


def _mean(rows: list[dict], key: str) -> float:
    return round(sum(float(r[key]) for r in rows) / len(rows), 4) if rows else 0.0


def group_summary(rows: list[dict]) -> dict:
    return {"n": len(rows), "accuracy_strict": _mean(rows, "acc"), "accuracy_lenient": _mean(rows, "acc_lenient"),
            "diagnosis_jaccard": _mean(rows, "dx"), "reward": _mean(rows, "score"), "cost": _mean(rows, "cost"),
            "exam_appropriateness": _mean(rows, "exam_score"), "exams": _mean(rows, "exams"),
            "questions": _mean(rows, "asks"), "turns": _mean(rows, "turns"),
            "format_error_rate": round(1 - _mean(rows, "format_ok"), 4) if rows else 0.0}  # fmt: skip


def summarise(records: list[dict], agent: str, bank: str) -> dict:
    by_source: dict[str, list[dict]] = defaultdict(list)
    by_noise: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        row = {**r["score"], "turns": r["turns"]}
        by_source[r["data_source"]].append(row)
        labels = r["noise"] or ["clean"]
        for label in labels:
            by_noise[label].append(row)
        by_noise["any noise" if r["noise"] else "no noise"].append(row)
    everything = [{**r["score"], "turns": r["turns"]} for r in records]
    return {"env": "clinic", "agent": agent, "bank": bank, "overall": group_summary(everything),
            "by_data_source": {k: group_summary(v) for k, v in sorted(by_source.items())},
            "by_noise": {k: group_summary(v) for k, v in sorted(by_noise.items())}}  # fmt: skip


def run_clinic_eval(bank: Path, server_url: str, agent: str, out: Path, concurrency: int = 4,
                    limit: int | None = None, resume: bool = False, token: str | None = None,
                    model: ModelSettings | None = None, max_turns: int = 20, progress: bool = True) -> dict:  # fmt: skip
    if agent not in AGENTS:
        raise ValueError(f"unknown clinic agent {agent!r}; choose one of {', '.join(AGENTS)}")
    items = load_items(bank)[:limit] if limit else load_items(bank)
    out.mkdir(parents=True, exist_ok=True)
    path = out / FILENAME
    if path.exists() and not resume:
        raise FileExistsError(f"{path} exists: pass --resume to continue that run, or choose another --out")
    done = set()
    trajectory.drop_torn_tail(path)  # an interrupted run may have left half a line
    if path.exists():
        done = {json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=server_url, headers=headers, timeout=60.0) as probe:
        schemas = {t["name"]: t["schema"] for t in probe.get("/v1/tools").raise_for_status().json()["tools"]}
    chat = None
    if agent == "openai":
        if model is None:
            raise ValueError("the openai agent needs --model-url and --model")
        import openai

        chat = openai.OpenAI(base_url=model.base_url, api_key=model.api_key, max_retries=2)
    lock, local = threading.Lock(), threading.local()

    def one(item: Item) -> None:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=server_url, headers=headers, timeout=60.0)
        prompt_text = "\n".join(m["content"] for m in item.prompt)
        if agent == "openai":
            tools = [schemas[n] for n in item.extra.get("tool_selection") or [] if n in schemas]
            policy = OpenAIClinician(item.prompt, tools, model, chat)  # type: ignore[arg-type]
        else:
            policy = make_clinician(agent, prompt_text)
        moves, final = run_case(local.client, policy, item, max_turns)
        score = clinic_score(transcript(moves, final), item.ground_truth, item.extra)
        record = {"id": item.key, "patient_id": item.extra["patient_id"], "data_source": item.data_source,
                  "ground_truth": item.ground_truth, "noise": item.extra.get("noise", {}).get("labels", []),
                  "noise_plan": item.extra.get("noise", {}), "turns": len(moves) + (1 if final else 0),
                  "moves": [{"tool": m.tool, "arguments": m.arguments, "observation": m.observation}
                            for m in moves], "final": final, "score": score}  # fmt: skip
        with lock, path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")

    todo = [i for i in items if i.key not in done]
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [pool.submit(one, item) for item in todo]
        for future in tqdm(
            as_completed(futures), total=len(futures), desc=f"clinic {agent}", disable=not progress
        ):
            future.result()
    keys = {i.key for i in items}
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    records = [r for r in records if r["id"] in keys]
    results = summarise(records, agent, str(bank))
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    from case_env.clinic.report import write_report

    write_report(out, [(agent, results)], records)
    return results
