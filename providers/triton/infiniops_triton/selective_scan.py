"""Placeholder: the Triton selective_scan kernels are being written."""

IMPLEMENTATIONS: list = []
