"""Placeholder: the torch fused_qk_norm implementations are being written."""

IMPLEMENTATIONS: list = []
