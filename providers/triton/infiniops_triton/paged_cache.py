"""Placeholder: the Triton paged_cache kernels are being written."""

IMPLEMENTATIONS: list = []
