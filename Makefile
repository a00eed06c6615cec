# Two commands do all set-up on a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch for CPU machines: on the project's machines pip finds a local CPU wheel of this version; elsewhere
# a plain `torch` would pull the CUDA build, so pass
#   TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
# (TORCH is passed to pip unquoted, so it may carry pip options).
TORCH  ?= torch==2.13.0
PROVIDERS := -e providers/torch -e providers/triton -e providers/cupy
STAMP  := $(VENV)/.installed

.PHONY: install demo test lint matrix test-gpu check-gpu bench-gpu clean

$(STAMP): pyproject.toml providers/*/pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e ".[llm,serve,test]" $(PROVIDERS)
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/infiniops providers
	$(BIN)/infiniops matrix --device cpu
	$(BIN)/infiniops explain flash_attn_varlen --device cuda --dtype float32 --head-dim 300 \
		|| echo "(exit 1: no provider serves this problem, as intended: the gate error says why)"
	$(BIN)/infinilm demo

lint: install
	$(BIN)/ruff check .

test: install lint
	$(BIN)/python -m pytest -q -p no:cacheprovider

matrix: install
	INFINIOPS_PROVIDERS=torch,triton,cupy $(BIN)/infiniops matrix --write capability_matrix

# On the GPU machine (no package registry there: everything it needs is preinstalled). The conformance
# suites run as parallel jobs on the one GPU (benchmarks/gpu_check.py), killed at GPU_CHECK_BUDGET
# seconds; `check-gpu` runs them alone. The attention and scan jobs are split in 3 shards of 100 examples
# (seeds printed), so the compiles of their specializations spread over the CPUs.
GPU_CHECK        := python3 benchmarks/gpu_check.py triton:300 cupy:300 torch:50 --shards 3 --jobs 12
GPU_CHECK_BUDGET ?= 540
GPU_CHECK_LOGS   ?= gpu-check-logs

test-gpu:
	python3 -m pip install -q --no-deps --no-build-isolation -e . $(PROVIDERS)
	python3 -m pytest -q -p no:cacheprovider -m gpu tests
	$(GPU_CHECK) --logs $(GPU_CHECK_LOGS) --budget $(GPU_CHECK_BUDGET)

check-gpu:
	python3 -m pip install -q --no-deps --no-build-isolation -e . $(PROVIDERS)
	$(GPU_CHECK) --logs $(GPU_CHECK_LOGS) --budget $(GPU_CHECK_BUDGET)

# The tables of one run; benchmarks/RESULTS.md is the curated, dated record of the runs quoted in issues.
BENCH_OUT ?= bench-latest.md

bench-gpu:
	python3 -m pip install -q --no-deps --no-build-isolation -e . $(PROVIDERS)
	python3 benchmarks/ops.py --write $(BENCH_OUT)

clean:
	rm -rf $(VENV) build *.egg-info providers/*/*.egg-info
