"""The Triton sampler on CUDA (skipped without a CUDA device): one launch whose row programs meet at barriers
draws the same tokens as one launch per step (the interpreter's way) and as the torch provider, over the
splits of a row the launch picks for small and large batches, with and without penalties, at Qwen's
vocabulary; and it never synchronizes with the device."""

from __future__ import annotations

import pytest
import torch

import infiniops_py as ops

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _case(n: int, v: int, seed: int, penalized: bool) -> tuple[torch.Tensor, dict[str, object]]:
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, v, generator=gen) * 3).to("cuda", torch.bfloat16)
    kw: dict[str, object] = {
        "top_k": torch.tensor([(0, 50, 1, 2000, v)[i % 5] for i in range(n)], dtype=torch.int32, device="cuda"),
        "top_p": torch.tensor([(0.9, 1.0, 0.5, 0.95, 0.0)[i % 5] for i in range(n)], device="cuda"),
        "temperature": torch.tensor([(0.8, 1.0, 0.0, 1.3, 0.5, 0.7)[i % 6] for i in range(n)], device="cuda"),
        "min_p": torch.tensor([(0.0, 0.0, 0.05)[i % 3] for i in range(n)], device="cuda"),
        "seed": torch.randint(-(2**62), 2**62, (n,), generator=gen).cuda(),
        "offset": torch.arange(n, device="cuda") * 7,
    }
    if penalized:
        kw.update(repetition_penalty=torch.full((n,), 1.2, device="cuda"),
                  frequency_penalty=torch.full((n,), 0.3, device="cuda"),
                  presence_penalty=torch.full((n,), 0.1, device="cuda"),
                  output_token_counts=torch.randint(0, 3, (n, v), generator=gen, dtype=torch.int32).cuda())
    return logits, kw


def _kernel_args(logits: torch.Tensor, kw: dict[str, object]) -> tuple[object, ...]:
    """The implementation's arguments as the public function builds them (caught on their way to `launch`)."""
    calls: list[tuple[object, ...]] = []
    from infiniops_triton import sampling as triton_sampling

    original = triton_sampling.launch

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(args)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    triton_sampling.launch = spy  # type: ignore[assignment]
    try:
        with ops.use("triton"):
            ops.top_k_top_p_sampling_from_logits(logits, **kw)  # type: ignore[arg-type]
    finally:
        triton_sampling.launch = original  # type: ignore[assignment]
    assert len(calls) == 1
    return calls[0]


@pytest.mark.parametrize("penalized", [False, True])
@pytest.mark.parametrize(("n", "v"), [(1, 151936), (3, 151936), (64, 151936), (200, 5000), (5, 1000)])
def test_one_launch_draws_what_one_launch_per_step_and_the_torch_provider_draw(n: int, v: int,
                                                                               penalized: bool) -> None:
    from infiniops_triton import sampling as triton_sampling

    logits, kw = _case(n, v, seed=n * 1000 + v, penalized=penalized)
    args = _kernel_args(logits, kw)
    p, _ = triton_sampling.split(n, v, logits.device)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert p >= 1 and (p == 1 or n * p <= triton_sampling._PER_SM * sms)
    counters = torch.zeros(2 * n, dtype=torch.int32, device="cuda")
    one = triton_sampling.launch(*args[:-1], torch.full((n,), -7, dtype=torch.int32, device="cuda"),
                                 counters=counters)
    steps = triton_sampling.launch(*args[:-1], torch.full((n,), -7, dtype=torch.int32, device="cuda"),
                                   one_launch=False)
    with ops.use("torch"):
        want = ops.top_k_top_p_sampling_from_logits(logits, **kw)  # type: ignore[arg-type]
    seen = f"one launch {one.tolist()[:12]}, a launch per step {steps.tolist()[:12]}, torch {want.tolist()[:12]}"
    assert one.tolist() == steps.tolist(), seen
    agree = (one == want).float().mean().item()
    assert agree >= 0.95, f"{agree:.3f} of the rows agree with the torch provider: {seen}"  # float32 rounding
    assert bool(((one >= 0) & (one < v)).all()), seen
    greedy = kw["temperature"] == 0  # type: ignore[operator]
    assert torch.equal(one[greedy], want[greedy]), seen  # the argmax of the (penalized) logits, exactly
    k, groups = kw["top_k"], -(-v // triton_sampling._GROUP)
    small = (k > 0) & (k <= groups) & (k < v) & ~greedy  # type: ignore[operator]
    assert torch.equal(counters[n:] > 0, small), "the rows of a small top-k were not compacted"


def test_more_programs_than_the_launch_allows_are_refused() -> None:
    from infiniops_triton import sampling as triton_sampling

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    logits, kw = _case(sms, 4096, seed=1, penalized=False)
    args = _kernel_args(logits, kw)
    with pytest.raises(ValueError, match="deadlock"):
        triton_sampling.launch(*args, chunks=(3, 2048))


def test_no_synchronization() -> None:
    logits, kw = _case(8, 151936, seed=2, penalized=False)
    with ops.use("triton"):
        ops.top_k_top_p_sampling_from_logits(logits, **kw)  # type: ignore[arg-type]  # compiles
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            ops.top_k_top_p_sampling_from_logits(logits, **kw)  # type: ignore[arg-type]
        finally:
            torch.cuda.set_sync_debug_mode("default")
