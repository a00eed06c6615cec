"""Placeholder: the Triton add kernels are being written."""

IMPLEMENTATIONS: list = []
