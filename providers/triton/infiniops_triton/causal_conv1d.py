"""Placeholder: the Triton causal_conv1d kernels are being written."""

IMPLEMENTATIONS: list = []
