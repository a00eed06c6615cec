"""Placeholder: the fused_qk_norm strategies are being written."""

STRATEGIES: dict = {}
