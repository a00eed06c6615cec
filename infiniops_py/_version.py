"""The version of infiniops-py (one place, read by the package, the CLI and plugin loading)."""

__version__ = "0.1.0"
