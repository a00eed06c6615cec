"""Placeholder: the torch flash_attn implementations are being written."""

IMPLEMENTATIONS: list = []
