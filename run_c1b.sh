#!/bin/bash
# Session 10 run C1b: the model GPU tests on the fused default path (gemm_add_rms_norm), the decode Gemm table.
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")"
L=$OUT/c1b.log
{ date -u; } | tee $L
python3 -m pip install -q --no-deps --no-build-isolation -e . -e providers/torch -e providers/triton -e providers/cupy 2>&1 | tail -2 | tee -a $L
echo "== gpu tests $(date -u +%T)" | tee -a $L
timeout 330 python3 -m pytest -q -m gpu -rs tests/test_infinilm/test_lm_gpu.py tests/test_infinilm/test_mamba2_gpu.py tests/test_torch_ops_gpu.py 2>&1 | tail -25 | tee -a $L
echo "== end $(date -u +%T)" | tee -a $L
