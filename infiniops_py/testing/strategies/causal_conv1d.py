"""Placeholder: the causal_conv1d strategies are being written."""

STRATEGIES: dict = {}
