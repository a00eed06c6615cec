"""The demo checkpoint: a small Qwen3 with a byte-level tokenizer, built once under the user cache dir.

Built from transformers' `Qwen3Config` with ``torch.manual_seed(0)``, then taught one sentence (`TEXT`,
then end-of-text) with a few AdamW steps on one CPU thread, so that greedy decoding from its start gives
readable text: a visible check that the whole data path (paged cache, batched prefill, decode) is right.
Building takes a few seconds, once. The cache dir is
``$INFINILM_CACHE``, else ``$XDG_CACHE_HOME/infinilm``, else ``~/.cache/infinilm``. The checkpoint is
written to a temporary directory and renamed into place, so an interrupted build is never reused.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

import torch

from infinilm.config_checks import ConfigError

__all__ = ["DEMO_CONFIG", "PROMPT", "TEXT", "build_byte_tokenizer", "cache_dir", "demo_checkpoint"]

DEMO_NAME = "qwen3-demo-v2"
EOS = "<|endoftext|>"
TEXT = ("InfiniOps-Py runs this model through a capability resolver: every gemm, rms_norm, fused_qk_norm, "
        "paged cache write and flash attention call picks the best provider that serves it, or says why none can.")
PROMPT = "InfiniOps"
_TEACH_STEPS = 150
DEMO_CONFIG: Final[Mapping[str, Any]] = MappingProxyType({
    "vocab_size": 257, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": True, "eos_token_id": 256,
    "bos_token_id": None,
})


def cache_dir() -> Path:
    """``$INFINILM_CACHE``, else ``$XDG_CACHE_HOME/infinilm``, else ``~/.cache/infinilm`` (not created here)."""
    if os.environ.get("INFINILM_CACHE"):
        return Path(os.environ["INFINILM_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "infinilm"


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's byte -> printable character map, which the ByteLevel pre-tokenizer and decoder use.
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def build_byte_tokenizer() -> object:
    """A byte-level tokenizer: token id b is byte b (0..255), 256 is ``<|endoftext|>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    return tok


def _teach(model: torch.nn.Module, ids: list[int]) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same float sums, hence the same weights, on every run
    try:
        batch = torch.tensor([ids])
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for _ in range(_TEACH_STEPS):
            model(batch, labels=batch).loss.backward()
            opt.step()
            opt.zero_grad()
    finally:
        torch.set_num_threads(threads)
    model.eval()


def demo_checkpoint(root: Path | None = None) -> Path:
    """The demo checkpoint directory under `root` (default: `cache_dir`), built on first use.

    Raises:
        ConfigError: the cache directory cannot be created or written (a file in its place, no permission, a
            full disk); the message names the directory and how it was chosen.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    base = root or cache_dir()
    final = base / DEMO_NAME
    if (final / "tokenizer.json").is_file():
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():  # an incomplete directory (no tokenizer.json): never reuse it
            shutil.rmtree(final)
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
    except OSError as err:
        raise _cache_error(base, root, err) from None
    try:
        tokenizer = build_byte_tokenizer()
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(Qwen3Config(**DEMO_CONFIG))
        _teach(model, [*tokenizer.encode(TEXT).ids, DEMO_CONFIG["eos_token_id"]])
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # no "Writing model shards" bar for a one-file checkpoint
        try:
            model.save_pretrained(str(tmp))
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        tokenizer.save(str(tmp / "tokenizer.json"))  # written last: marks a complete build
        tmp.rename(final)
    except OSError as err:
        if not (final / "tokenizer.json").is_file():  # not a concurrent build that won the rename
            raise _cache_error(base, root, err) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _cache_error(base: Path, root: Path | None, err: OSError) -> ConfigError:
    """The error of a demo cache directory that cannot be written, naming it and where its path came from."""
    if root is not None:
        origin = "the root given"
    elif os.environ.get("INFINILM_CACHE"):
        origin = "$INFINILM_CACHE"
    else:
        origin = "$XDG_CACHE_HOME/infinilm" if os.environ.get("XDG_CACHE_HOME") else "~/.cache/infinilm"
    if isinstance(err, FileExistsError | NotADirectoryError):
        reason = "a file, not a directory, is in its path"
    else:
        reason = err.strerror or str(err)
    where = f" ({err.filename})" if err.filename and str(err.filename) != str(base) else ""
    return ConfigError(f"{base} ({origin}): cannot hold the demo checkpoint: {reason}{where}; point INFINILM_CACHE "
                       "at a writable directory")
