"""Placeholder: the Triton flash_attn kernels are being written."""

IMPLEMENTATIONS: list = []
