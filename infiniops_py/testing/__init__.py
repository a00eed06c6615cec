"""Conformance testing: hypothesis strategies per operator, the tolerance table, the suite, the pytest plugin."""
