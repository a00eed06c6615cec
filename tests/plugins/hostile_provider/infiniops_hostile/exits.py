"""Ends the process when imported."""

import sys

sys.exit(3)
