"""Integrations with other frameworks; each submodule imports its framework only when it is imported itself.

`infiniops_py.integrations.transformers`: `kernelize(model)` runs a Hugging Face transformers model's norms
and attention through the InfiniOps-Py operators (needs the ``llm`` extra: transformers).
"""
