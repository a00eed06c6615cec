"""Placeholder: the torch causal_conv1d implementations are being written."""

IMPLEMENTATIONS: list = []
