"""Integrations with other frameworks; each submodule imports its framework only when it is imported itself.

`infiniops_py.integrations.transformers`: `kernelize(model)` runs a Hugging Face transformers model's norms,
residual adds, attention, RoPE and gated MLPs through the InfiniOps-Py operators, and importing it registers the
``"infiniops"`` attention implementation with transformers (needs the ``llm`` extra: transformers).
"""
