"""Placeholder: the gemm strategies are being written."""

STRATEGIES: dict = {}
