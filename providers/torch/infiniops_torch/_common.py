"""What the torch provider's implementations share: its devices, dtypes and priority."""

from __future__ import annotations

from typing import Final

from infiniops_py import OneOf

__all__ = ["DEVICES", "FLOAT_DTYPES", "PRIORITY"]

PRIORITY: Final = 10
DEVICES: Final = OneOf("device_type", ("cpu", "cuda"))
FLOAT_DTYPES: Final = OneOf("dtype", ("float16", "bfloat16", "float32"))
