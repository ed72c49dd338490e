"""Every private name of verl that case-env uses, one test each, held to the signature case-env calls it
with: a verl upgrade that renames or reshapes one fails the test named after it, instead of dropping
trajectories in a run (verl's trainer counts a loop that raises as a failed sample). docs/training.md lists
them and where case-env uses them."""

from __future__ import annotations

import inspect

import pytest
from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker
from verl.experimental.agent_loop.tool_agent_loop import AgentData, ToolAgentLoop
from verl.trainer.ppo.v1 import AgentLoopWorkerTQ
from verl.utils.dataset.rl_dataset import RLHFDataset

# (owner, name, the parameters case-env passes, in order), and where case-env uses it
METHODS = {
    "ToolAgentLoop._handle_pending_state": (ToolAgentLoop, ["agent_data", "sampling_params"]),  # clinic loop
    "ToolAgentLoop._handle_generating_state": (
        ToolAgentLoop,
        ["agent_data", "sampling_params", "ignore_termination"],
    ),  # clinic loop
    "ToolAgentLoop._handle_processing_tools_state": (ToolAgentLoop, ["agent_data"]),  # clinic loop
    "ToolAgentLoop._call_tool": (ToolAgentLoop, ["tool_call", "tools_kwargs", "agent_data"]),  # clinic loop
    "ToolAgentLoop._make_request_id": (ToolAgentLoop, ["priority", "full_determinism"]),  # preflight
    "AgentLoopWorker._compute_teacher_logprobs": (
        AgentLoopWorker,
        ["output", "prompt_ids", "response_ids", "validate", "sample_kwargs"],
    ),  # OPSD
    "RLHFDataset._read_files_and_tokenize": (RLHFDataset, []),  # the dataset class
    "RLHFDataset._process_multi_modal_info": (RLHFDataset, ["messages", "image_patch_size", "config"]),
}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_a_private_method_case_env_calls_keeps_its_signature(name):
    owner, wanted = METHODS[name]
    method = getattr(owner, name.split(".", 1)[1], None)
    assert method is not None, f"verl no longer has {name}"
    parameters = [p for p in inspect.signature(method).parameters if p not in ("self", "_ray_trace_ctx")]
    assert parameters[: len(wanted)] == wanted, (name, parameters)


def test_agent_data_takes_its_fields_in_the_order_the_preflight_passes_them():
    fields = list(inspect.signature(AgentData.__init__).parameters)[1:]
    assert fields == [
        "messages",
        "image_data",
        "video_data",
        "audio_data",
        "mm_processor_kwargs",
        "metrics",
        "request_id",
        "tools_kwargs",
    ]


def test_the_tool_loop_reads_a_turns_offered_tools_from_agent_data():
    # the clinic loop sets `_active_tools` / `_active_tool_schemas` on AgentData to offer a row's tools
    source = inspect.getsource(ToolAgentLoop)
    assert 'getattr(agent_data, "_active_tools"' in source and "_active_tool_schemas" in source


def test_the_v1_worker_is_a_ray_actor_whose_class_opsd_subclasses():
    assert inspect.isclass(AgentLoopWorkerTQ.__ray_actor_class__)


def test_a_manager_builds_its_workers_from_the_class_opsd_replaces():
    assert "self.agent_loop_workers_class" in inspect.getsource(AgentLoopManager)


def test_the_dataset_keeps_its_rows_and_patch_size_where_the_dataset_class_reads_them():
    source = inspect.getsource(RLHFDataset)
    assert "self.dataframe" in source and "self.image_patch_size" in source
