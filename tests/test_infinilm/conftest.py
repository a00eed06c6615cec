"""Fixtures of the infinilm tests: tiny checkpoints saved by transformers, one intra-op thread.

The tests run with one intra-op thread: these models are far too small to gain from more, and on a shared
2-core CI machine OpenMP threads that spin while waiting make each step tens of times slower.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from lm_helpers import CheckpointFactory, hf_model


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> CheckpointFactory:
    """``checkpoint(family, tied=..., **config overrides)`` -> (directory, the HF model), cached per session."""
    made: dict[tuple[object, ...], tuple[Path, torch.nn.Module]] = {}

    def make(family: str, *, tied: bool = False, **overrides: object) -> tuple[Path, torch.nn.Module]:
        key = (family, tied, repr(sorted(overrides.items())))
        if key not in made:
            model = hf_model(family, tied=tied, **overrides)
            path = tmp_path_factory.mktemp(f"{family}-{'tied' if tied else 'untied'}")
            model.save_pretrained(str(path))
            made[key] = (path, model)
        return made[key]

    return make
