"""Placeholder: the torch paged_cache implementations are being written."""

IMPLEMENTATIONS: list = []
