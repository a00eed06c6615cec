"""Which role a module of a transformers model plays (`role_of`): by transformers' own hub-kernel layer name where
the installed transformers sets one, else by the family's class; never by the text of its code."""

from __future__ import annotations

import torch

from infiniops_py.integrations.transformers._families import HUB_ROLES, SwapTargets

__all__ = ["keeps_forward", "role_of"]


def role_of(module: torch.nn.Module, family: SwapTargets) -> tuple[str, type] | None:
    """(role, the class that declares it) of `module`, or None when it plays none.

    The role comes from the first class in ``type(module).__mro__`` that declares one: transformers'
    ``use_kernel_forward_from_hub(name)`` (the ``kernel_layer_name`` it sets on a class where the ``kernels``
    package is installed; HF ``kernels.kernelize`` swaps by the same name) with a name in `HUB_ROLES`, or a class
    of `family.module` named in `family.classes`. The module computes the role only when its class keeps that
    class's forward (`keeps_forward`): a subclass that overrides ``forward`` (under any name) computes something
    else.
    """
    cls = type(module)
    for base in cls.__mro__:
        hub = base.__dict__.get("kernel_layer_name")
        role = HUB_ROLES.get(hub) if isinstance(hub, str) else None
        if role is None and base.__module__ == family.module:
            role = family.classes.get(base.__name__)
        if role is not None:
            return role, base
    return None


def keeps_forward(module: torch.nn.Module, declared: type) -> bool:
    """Whether `module`'s class runs the forward of `declared` (its own class or an ancestor)."""
    return type(module).forward is declared.forward
