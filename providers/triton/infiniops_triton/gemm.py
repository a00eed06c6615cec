"""Placeholder: the Triton gemm kernels are being written."""

IMPLEMENTATIONS: list = []
