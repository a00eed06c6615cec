"""Placeholder: the add strategies are being written."""

STRATEGIES: dict = {}
