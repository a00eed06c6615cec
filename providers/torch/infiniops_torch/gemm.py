"""Placeholder: the torch gemm implementations are being written."""

IMPLEMENTATIONS: list = []
