"""Placeholder: the paged_cache strategies are being written."""

STRATEGIES: dict = {}
