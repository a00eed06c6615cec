"""Placeholder: the Triton fused_qk_norm kernels are being written."""

IMPLEMENTATIONS: list = []
