# Two commands do all set-up on a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch for CPU machines: on the project's machines pip finds a local CPU wheel of this version; elsewhere
# a plain `torch` would pull the CUDA build, so pass
#   TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
# (TORCH is passed to pip unquoted, so it may carry pip options).
TORCH  ?= torch==2.13.0
# The Triton the project's kernels and their sm_90 compile checks are tested with (the H200's); the provider
# itself accepts triton>=3.6,<3.8, and a fresh install would otherwise take the newest (3.7.x).
TRITON ?= triton==3.6.0
# CuPy only where a CUDA device is (nvidia-smi lists one), as the provider's extra for the driver's CUDA major
# version (12, else 13); elsewhere the cupy provider installs without it and shows as unable to run.
CUDA_MAJOR := $(shell nvidia-smi -L >/dev/null 2>&1 && nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -1)
CUPY_EXTRA := $(if $(CUDA_MAJOR),[cuda$(if $(filter 12,$(CUDA_MAJOR)),12,13)])
PROVIDERS := -e providers/torch -e providers/triton -e "providers/cupy$(CUPY_EXTRA)"
STAMP  := $(VENV)/.installed
# setuptools says "Editable installation ... Please be careful with folders in your working directory" in a
# box per editable package: information only, so it is filtered out of the installs; -qq leaves pip's errors
# only (not, say, a warning per missing folder of a machine's configured package index).
PIP    := PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip

.PHONY: install demo test lint matrix chromium test-gpu check-gpu bench-gpu clean

$(STAMP): pyproject.toml providers/*/pyproject.toml Makefile
	@echo "installing into $(VENV) (the first time takes minutes)$(if $(CUPY_EXTRA), with CuPy $(CUPY_EXTRA),)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(PIP) install -qq --upgrade pip setuptools wheel
	@$(PIP) install -qq $(TORCH) $(TRITON)
	@$(PIP) install -qq -e ".[dev]" $(PROVIDERS)
	@touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/infiniops providers
	$(BIN)/infiniops matrix --device cpu --op rms_norm --op flash_attn_varlen --op selective_scan
	$(BIN)/infiniops explain flash_attn_varlen --device cuda --dtype float32 --head-dim 300 \
		|| echo "(exit 1: no provider serves this problem, as intended: the report says why)"
	$(BIN)/infinilm demo

lint: install
	$(BIN)/ruff check .

# The browser test of the capability-matrix page needs Chromium: installed from the distribution's packages
# when this runs as root with apt-get (CI); otherwise `make test` stops here and says how to install it.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium (apt-get) for the matrix page's browser test"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null; \
	else \
		echo "make test needs Chromium for the matrix page's browser test: run as root, or install it" \
			"(Debian/Ubuntu: sudo apt-get install chromium)" >&2; exit 1; \
	fi

test: install lint chromium
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
	PYTHONWARNINGS="ignore:Editable installation" python3 -m pip install -q --no-deps --no-build-isolation -e . $(PROVIDERS)
	python3 -m pytest -q -p no:cacheprovider -m gpu tests
	$(GPU_CHECK) --logs $(GPU_CHECK_LOGS) --budget $(GPU_CHECK_BUDGET)

check-gpu:
	PYTHONWARNINGS="ignore:Editable installation" python3 -m pip install -q --no-deps --no-build-isolation -e . $(PROVIDERS)
	$(GPU_CHECK) --logs $(GPU_CHECK_LOGS) --budget $(GPU_CHECK_BUDGET)

# The tables of one run; benchmarks/RESULTS.md is the curated, dated record of the runs quoted in issues.
BENCH_OUT ?= bench-latest.md

bench-gpu:
	PYTHONWARNINGS="ignore:Editable installation" python3 -m pip install -q --no-deps --no-build-isolation -e . $(PROVIDERS)
	python3 benchmarks/ops.py --write $(BENCH_OUT)

clean:
	rm -rf $(VENV) build *.egg-info providers/*/*.egg-info
