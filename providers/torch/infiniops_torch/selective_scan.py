"""Placeholder: the torch selective_scan implementations are being written."""

IMPLEMENTATIONS: list = []
