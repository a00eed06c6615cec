"""A provider plugin that fails on import, as one with a missing native library would.

`infiniops providers` must list it with this error while every other provider keeps working.
"""

raise ImportError("infiniops_broken: libexample_kernels.so not found (this test plugin always fails to import)")
