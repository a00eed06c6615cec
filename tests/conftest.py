"""Shared pytest configuration of the test suite."""

from __future__ import annotations

import os
import tempfile

# tests/triton_interp needs TRITON_INTERPRET=1 set before Triton defines any kernel: test_triton_interp.py
# runs it in a subprocess with the variables set, so the normal collection leaves it out.
collect_ignore = [] if os.environ.get("INFINIOPS_TRITON_INTERPRET_CPU") == "1" else ["triton_interp"]

# Measured rankings persist per machine (INFINIOPS_CACHE, else the XDG cache): a developer's own tuning file must
# not change which implementation a test gets, so the suite (and the processes it starts) uses a fresh, empty one.
os.environ["INFINIOPS_CACHE"] = tempfile.mkdtemp(prefix="infiniops-test-cache-")
