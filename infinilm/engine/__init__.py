"""The engine: gates, loading, the KV cache or the recurrent state pool, the scheduler, the runners and CUDA graphs.

`Engine` is the entry point; `check_options`, `check_prompt` and `max_positions` are the checks it runs before
any weight is read, also used by the CLI.
"""

from __future__ import annotations

from infinilm.engine.engine import Engine, StepOutput, check_options, check_prompt, max_positions

__all__ = ["Engine", "StepOutput", "check_options", "check_prompt", "max_positions"]
