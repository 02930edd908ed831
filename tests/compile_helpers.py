"""The compiled-vs-eager check of the bare MLM graph (mlm_core.train.compiled.mlm_loss), shared by
test_compile.py and test_long_context.py so both hold the compiled loss to the same tolerances.

The compiled function stays in each test (``own``, a wrapper with its own code object): dynamo caches per code
object, so a wrapper defined here would pool the two tests' graphs (other models, other backends) in one cache
and break test_compile's one-entry count."""
from __future__ import annotations


def assert_compiled_matches_eager(enc, fn, ids, seg, labels, label_smoothing: float, budget: int) -> None:
    """``fn(enc, ids, seg, labels, label_smoothing, budget)`` (the compiled mlm_loss) against the eager
    ``enc(ids, seg, labels, label_smoothing)["loss"]``: the loss within a relative 1e-5, every parameter's
    gradient within rtol 1e-4 / atol 1e-6 (float rounding: fused kernels, another summation order)."""
    import torch
    enc.zero_grad()
    ref = enc(ids, seg, labels, label_smoothing)["loss"]
    ref.backward()
    g_ref = {n: p.grad.clone() for n, p in enc.named_parameters()}
    enc.zero_grad()
    got = fn(enc, ids, seg, labels, label_smoothing, budget)
    got.backward()
    assert abs(float(got.detach()) - float(ref.detach())) <= 1e-5 * abs(float(ref.detach()))
    for n, p in enc.named_parameters():
        torch.testing.assert_close(p.grad, g_ref[n], rtol=1e-4, atol=1e-6, msg=n)
