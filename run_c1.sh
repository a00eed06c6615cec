#!/bin/bash
# Session 10 run C1: the merged kernels on the GPU: gemm_add_rms_norm (#23), the conv update's grid, the
# decode step, the model GPU tests, conformance of the changed kernels (gemm_add_rms_norm, selective_scan).
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")"
L=$OUT/c1.log
{ date -u; git log --oneline -1 2>/dev/null; } | tee $L
python3 -m pip install -q --no-deps --no-build-isolation -e . -e providers/torch -e providers/triton -e providers/cupy 2>&1 | tail -2 | tee -a $L
python3 -m pip install -q --no-deps --no-index --find-links .whl einops 2>&1 | tail -2 | tee -a $L
echo "== add_norm gpu tests $(date -u +%T)" | tee -a $L
timeout 120 python3 -m pytest -q -m gpu tests/test_gemm_add_rms_norm_gpu.py 2>&1 | tail -6 | tee -a $L
echo "== conv update $(date -u +%T)" | tee -a $L
timeout 60 python3 benchmarks/gpu_conv_update.py 2>&1 | tail -8 | tee -a $L
echo "== decode add_norm + qwen3 engine $(date -u +%T)" | tee -a $L
timeout 170 python3 benchmarks/gpu_decode.py --part add_norm --part engine --model qwen3-0.6b 2>&1 | tee $OUT/decode_qwen3.log | grep -v "^  \|^    " | tail -30 | tee -a $L
echo "== mamba2 engine alone $(date -u +%T)" | tee -a $L
timeout 80 python3 benchmarks/gpu_decode.py --part engine --model mamba2-130m 2>&1 | tee $OUT/decode_mamba2.log | tail -8 | tee -a $L
echo "== conformance $(date -u +%T)" | tee -a $L
timeout 110 python3 benchmarks/gpu_check.py triton:300 --op gemm_add_rms_norm --op selective_scan --logs $OUT/gc --budget 95 --shards 2 2>&1 | tail -16 | tee -a $L
echo "== end $(date -u +%T)" | tee -a $L
