"""Placeholder: the flash_attn strategies are being written."""

STRATEGIES: dict = {}
