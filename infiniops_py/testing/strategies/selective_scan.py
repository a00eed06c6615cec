"""Placeholder: the selective_scan strategies are being written."""

STRATEGIES: dict = {}
