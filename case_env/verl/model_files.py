"""A model's tokenizer, processor and chat template, from files already on this machine (never a download).

`case-env train preflight` checks what verl will render with the model's own files: a local directory, or the
Hugging Face cache of a hub id. verl loads them with `hf_tokenizer` / `hf_processor` and applies
`custom_chat_template` to the processor when there is one, else to the tokenizer (`HFModelConfig`); this
module does the same. A VL processor needs torchvision for its video processor, which a CPU login node often
lacks; preflight only renders text and images, so there the processor is built with its image processor
and a stand-in for the video slot.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The VL processors verl 0.9.1 binds (verl/utils/tokenizer/tokenizer.py), by config `model_type`; all three
# take Qwen2-VL's image processor (transformers' image_processing_auto), whose PIL form needs no torchvision.
_PROCESSORS = {
    "qwen2_vl": "Qwen2VLProcessor",
    "qwen2_5_vl": "Qwen2_5_VLProcessor",
    "qwen3_vl": "Qwen3VLProcessor",
    "qwen3_vl_moe": "Qwen3VLProcessor",
}
_IMAGE_PROCESSOR = "Qwen2VLImageProcessorPil"


class NoVideo:
    """Stands in for a Qwen-VL processor's video processor where torchvision is missing (no video is sent)."""

    merge_size = 2
    temporal_patch_size = 2


def allow_no_video() -> None:
    """Let transformers' processors accept `NoVideo` in their video slot (once per process)."""
    from transformers.processing_utils import ProcessorMixin

    original = ProcessorMixin.check_argument_for_proper_class
    if getattr(original, "_case_env_shim", False):
        return

    def check(self, name, argument):
        return type(argument) if isinstance(argument, NoVideo) else original(self, name, argument)

    check._case_env_shim = True
    ProcessorMixin.check_argument_for_proper_class = check


@dataclass
class ModelFiles:
    """What verl renders prompts with: the tokenizer, the processor of a VL model, the config's model type."""

    path: Path
    model_type: str | None
    tokenizer: Any
    processor: Any = None

    @property
    def renderer(self) -> Any:
        """The object whose chat template verl renders with: the processor of a VL model, else the tokenizer."""
        return self.processor if self.processor is not None else self.tokenizer

    def use_template(self, template: str | None) -> None:
        """Apply a `custom_chat_template` as verl's agent loop worker does (processor and tokenizer)."""
        if template is None:
            return
        if self.processor is not None:
            self.processor.chat_template = template
        self.tokenizer.chat_template = template


def local_model_dir(model: str) -> Path | None:
    """`model` as a directory on this machine: the path itself, or the Hugging Face cache's snapshot of a hub
    id. None when its files are not here (nothing is downloaded)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=model, local_files_only=True))
    except Exception:  # not in the cache, or not a valid hub id: both mean "not on this machine"
        return None


def model_type(path: Path) -> str | None:
    try:
        return json.loads((path / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError):
        return None


def load(path: Path) -> ModelFiles:
    """The model's tokenizer and (VL) processor, loaded with verl's own helpers."""
    from verl.utils.tokenizer import hf_processor, hf_tokenizer

    kind = model_type(path)
    tokenizer = hf_tokenizer(str(path), local_files_only=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # verl warns when it falls back to no processor; handled below
        processor = hf_processor(str(path), local_files_only=True)
    if processor is None and kind in _PROCESSORS:
        processor = _image_only_processor(path, kind, tokenizer)
    return ModelFiles(path, kind, tokenizer, processor)


def _image_only_processor(path: Path, kind: str, tokenizer: Any) -> Any:
    import transformers

    allow_no_video()
    cls = getattr(transformers, _PROCESSORS[kind])
    chat_template = cls.get_processor_dict(str(path), local_files_only=True)[0].get("chat_template")
    return cls(
        image_processor=getattr(transformers, _IMAGE_PROCESSOR).from_pretrained(
            str(path), local_files_only=True
        ),
        tokenizer=tokenizer,
        video_processor=NoVideo(),
        chat_template=chat_template,
    )
