# attnlab: `make install && make train`, `make test`. `make help` lists every target.
PYTHON_SYS ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
# Test workers: pytest-xdist processes (each runs torch on one thread).
WORKERS ?= 2

.DEFAULT_GOAL := help
.PHONY: help install install-bench train test test-all lint format clean compare bench-attention bench-translation bench-lm bench-causal bench-disk bench-dialogue bench-gpu bench-extrapolation bench-lm-data bench-lm-litdata

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-18s %s\n", $$1, $$2}'

install: $(VENV)/.installed ## create .venv with the pinned CPU torch, then the package (editable, with the dev extras: what running and testing need)

# torch first: installing lightning or torchmetrics without it pulls a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON_SYS) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

install-bench: $(VENV)/.installed-bench ## install, plus the bench extras (what the benchmarks compare against)

$(VENV)/.installed-bench: $(VENV)/.installed
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev,bench]'
	touch $@

train: install ## a first look, about 30 s on 2 cores: the position probe without and with positions
	@echo "attnlab: training the position probe with no encoding and with sinusoidal positions,"
	@echo "  two runs side by side, about 30 s on 2 cores. The prediction: without positions every"
	@echo "  token looks the same, so val/acc stays at the probe's bound (0.118); sinusoidal nears 1."
	$(PY) train.py -m experiment=first_look hydra/launcher=joblib hydra.launcher.n_jobs=2

# The tests marked slow start a process, train a model, or cover every combination of the
# variants: `make test` leaves them out (about 3,600 tests run; the 20,700 slow cases of the
# combinations are not even made, tests/conftest.py); `make test-all` runs every test, the
# slow ones included.
test: install ## the fast suite: every test but those marked slow (what CI runs)
	$(PY) -m pytest -n $(WORKERS) -q -m "not slow"

test-all: install ## every test, the slow ones included
	$(PY) -m pytest -n $(WORKERS) -q

lint: install ## ruff check and format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install ## apply ruff's fixes and formatting
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

compare: install ## compare the runs below DIR: make compare DIR=logs/probe/multiruns/<time>
	@test -n "$(DIR)" || { echo "make compare needs DIR=<a sweep or run directory>"; exit 2; }
	$(VENV)/bin/attnlab compare $(DIR)

clean: ## remove the venv, run logs and caches (not data/ downloads)
	rm -rf $(VENV) logs multirun outputs wandb .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

bench-attention: install-bench ## time and memory of every attention variant -> BENCHMARKS.md
	$(PY) benchmarks/attention.py

bench-translation: install-bench ## translation speed (vs torch.nn.Transformer) and 30-min quality -> BENCHMARKS.md
	$(PY) benchmarks/translation.py speed
	$(PY) benchmarks/translation.py quality

bench-extrapolation: install-bench ## every encoding evaluated at 16x its training length of 1,024: time, memory -> BENCHMARKS.md
	$(PY) benchmarks/extrapolation.py

bench-lm-data: install-bench ## a generated 1 GB corpus: tokenization MB/s and peak memory vs nanoGPT's prepare.py approach, time to the first step -> BENCHMARKS.md
	$(PY) benchmarks/lm_data.py

bench-lm-litdata: install-bench ## the token stream against LitData's optimized chunks, 256 MB (needs litdata installed beside attnlab: see the script) -> BENCHMARKS.md
	$(PY) benchmarks/lm_litdata.py

bench-lm: install-bench ## nanoGPT's Shakespeare run over 3 seeds (vs its 1.88), Lightning vs a plain loop -> BENCHMARKS.md
	$(PY) benchmarks/lm.py anchor
	$(PY) benchmarks/lm.py speed

bench-causal: install-bench ## attnlab's causal LM vs nn.TransformerEncoder, eager and compiled -> BENCHMARKS.md
	$(PY) benchmarks/causal.py

bench-disk: install-bench ## disk per finished run, before and after weights-only best checkpoints -> BENCHMARKS.md
	$(PY) benchmarks/disk.py

bench-dialogue: install-bench ## pairs/s of dialogue's test phase (beam search over the Chit-Chat test split) -> BENCHMARKS.md
	$(PY) benchmarks/dialogue.py

bench-gpu: install-bench ## on a CUDA machine: FlexAttention check, speed vs nn.Transformer and x-transformers, variants, decoding, the causal stack in bf16 and on FlashAttention, GPT-2 small vs nanoGPT -> BENCHMARKS.md
	$(PY) benchmarks/gpu.py check
	$(PY) benchmarks/gpu.py speed
	$(PY) benchmarks/gpu.py variants
	$(PY) benchmarks/gpu.py decode
	$(PY) benchmarks/causal.py --device cuda
	$(PY) benchmarks/gpt2.py
