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

.PHONY: demo demo-real test reliability lint format bench-data clean browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml setup.py | $(BIN)/python
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e '.[dev,verl]'
	# the openenv extra (the OpenEnv baseline of `case-env bench server`) without its web UI's gradio,
	# which pins Pillow below 13 and would replace ours; fastmcp is what its server imports
	$(BIN)/python -m pip install --quiet --no-deps openenv-core==0.3.0
	$(BIN)/python -m pip install --quiet 'fastmcp>=3.0.0'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/case-env synth --out $(DEMO_ROOT) --patients $(DEMO_PATIENTS) --profile $(DEMO_PROFILE) --seed $(DEMO_SEED)
	$(BIN)/case-env data check $(DEMO_ROOT)
	$(BIN)/case-env bank build --data-root $(DEMO_ROOT) --out $(DEMO_BANK) --seed $(DEMO_SEED)
	$(BIN)/case-env rollouts --bank $(DEMO_BANK) --split train --data-root $(DEMO_ROOT) --per-source 8
	# the clinic environment (issue 8): cases next to the imaging patients, a bank at MedExAgent's training
	# noise rates, scripted-clinician rollouts through verl, then the acceptance comparison with its report
	$(BIN)/case-env synth --env clinic --out $(DEMO_ROOT) --patients $(DEMO_CASES) --seed $(DEMO_SEED)
	$(BIN)/case-env bank build --env clinic --data-root $(DEMO_ROOT) --out $(DEMO_CLINIC)/bank --seed $(DEMO_SEED) \
		--patient-noise 0.3 --exam-noise 0.1
	$(BIN)/case-env rollouts --bank $(DEMO_CLINIC)/bank --split train --data-root $(DEMO_ROOT) --per-source 16
	$(BIN)/python scripts/clinic_acceptance.py --cases $(DEMO_CASES) --seed $(DEMO_SEED) --out $(DEMO_CLINIC)/acceptance
	# the case-reasoning environment (issue 9): synthetic case reports, sequential-attempt rollouts through
	# verl (submit_diagnosis, k = 5), then the scripted baselines' accuracy at 1/5/10 attempts and recall
	$(BIN)/case-env synth --env casereason --out $(DEMO_ROOT) --patients 150 --seed $(DEMO_SEED)
	$(BIN)/case-env bank build --env casereason --data-root $(DEMO_ROOT) --out $(DEMO_REASON)/bank --seed $(DEMO_SEED) \
		--mode sequential --attempts 5
	$(BIN)/case-env rollouts --bank $(DEMO_REASON)/bank --split train --data-root $(DEMO_ROOT) --per-source 16
	$(BIN)/python scripts/casereason_baselines.py --cases $(DEMO_CASES) --seed $(DEMO_SEED) --out $(DEMO_REASON)/baselines
	# every registered environment, with its personas and tools
	$(BIN)/case-env envs

# The real-data path (issue 16) on a machine without UK Biobank access: the synthetic patients as UK Biobank
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

test: $(STAMP) lint browser
	$(BIN)/python -m pytest

# The reliability suite at full scale (issue 7): fuzzing, hostile input, reward hacking, scope and auth,
# a 2,000-call burst, kill -9 under verl, a 50,000-call soak, corrupt data. `make test` runs it at CI scale.
reliability: $(STAMP)
	CASE_ENV_RELIABILITY=full CASE_ENV_RELIABILITY_OUT=reliability.json $(BIN)/python -m pytest tests/reliability -q
	@echo "figures: reliability.json"

# The report test opens report.html in a real headless Chromium (Debian's package; needs root to install).
browser:
	@command -v chromium >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core; }

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/deptry .  # every import declared, in core or in the extra that needs it

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench-data: $(STAMP)
	$(BIN)/case-env bench data --out bench-out/data --patients 2 --profiles ci,full

clean:
	rm -rf $(VENV) bench-out .pytest_cache .ruff_cache
