"""torch's side runs for real on the CPU: the float32 reference, the fallback
that serves specs cuDNN cannot, and the input checks both compiled graphs use."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.torch
try:
    import torch
except ImportError:  # the torch marker skips every test here (tests/conftest.py)
    torch = None

from graphcache import ExecutionError, GraphSpec  # noqa: E402
from graphcache.compilers.torch_sdpa import (  # noqa: E402
    TorchSdpaGraph,
    allowed_mask,
    random_inputs,
    reference,
    relative_error,
)


def make(**changes) -> GraphSpec:
    return GraphSpec.from_dict({"batch": 2, "heads_q": 4, "seq_q": 16, "head_dim": 16, **changes})


def test_masks_allow_exactly_the_documented_keys():
    causal = allowed_mask(make(mask="causal"))
    assert causal[3, 3] and not causal[3, 4] and causal[15, 0]
    br = allowed_mask(make(mask="causal_bottom_right", seq_q=4, seq_kv=16))
    assert br[0, 12] and not br[0, 13] and br[3, 15]
    window = allowed_mask(make(mask="sliding_window", window_left=2, window_right=1))
    assert window[5].nonzero().flatten().tolist() == [3, 4, 5, 6]
    assert allowed_mask(make()).all()


@pytest.mark.parametrize(
    "changes",
    [
        {"mask": "none"},
        {"mask": "causal"},
        {"mask": "causal_bottom_right", "seq_q": 8},
        {"mask": "sliding_window", "window_left": 3},
        {"mask": "causal", "heads_kv": 2, "layout": "bhsd"},
        {"mask": "causal", "padding": True},
        {"mask": "none", "generate_stats": True, "dtype": "bfloat16"},
    ],
    ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()),
)
def test_fallback_matches_the_float32_reference(changes):
    spec = make(**changes)
    inputs = random_inputs(spec, "cpu", seed=1)
    result = TorchSdpaGraph(spec).execute(**inputs)
    out = result[0] if spec.generate_stats else result
    ref, stats = reference(spec, **inputs)
    assert out.shape == spec.storage_shape("o") and out.dtype == inputs["q"].dtype
    assert relative_error(out, ref) < {"float16": 5e-3, "bfloat16": 2e-2}[spec.dtype]
    if spec.generate_stats:
        assert torch.allclose(result[1], stats)


def test_causal_fallback_is_never_unmasked():
    spec = make(mask="causal")
    inputs = random_inputs(spec, "cpu", seed=2)
    out = TorchSdpaGraph(spec).execute(**inputs)
    unmasked, _ = reference(make(mask="none"), **inputs)
    masked, _ = reference(spec, **inputs)
    assert relative_error(out, masked) < 5e-3
    assert relative_error(out, unmasked) > 0.05


def test_fallback_writes_into_out():
    spec = make()
    inputs = random_inputs(spec, "cpu")
    out = torch.empty(spec.storage_shape("o"), dtype=torch.float16)
    assert TorchSdpaGraph(spec).execute(**inputs, out=out) is out


@pytest.mark.parametrize(
    "bad, words",
    [
        # built in the test, so that collecting this file needs no torch
        (lambda: {"q": torch.zeros(2, 16, 4, 8, dtype=torch.float16)}, "q has shape"),
        (lambda: {"k": torch.zeros(2, 16, 4, 16, dtype=torch.float32)}, "k is torch.float32"),
        (lambda: {"v": torch.zeros(2, 4, 16, 16, dtype=torch.float16).transpose(1, 2)}, "contiguous"),
        (lambda: {"seq_len_q": torch.ones(2, 1, 1, 1, dtype=torch.int32)}, "padding=false"),
    ],
    ids=["q-shape", "k-dtype", "v-contiguous", "seq-len-without-padding"],
)
def test_bad_inputs_are_clear_errors(bad, words):
    spec = make()
    inputs = {**random_inputs(spec, "cpu"), **bad()}
    with pytest.raises(ExecutionError, match=words):
        TorchSdpaGraph(spec).execute(**inputs)


def test_padding_needs_lengths():
    spec = make(padding=True)
    inputs = random_inputs(spec, "cpu")
    inputs.pop("seq_len_kv")
    with pytest.raises(ExecutionError, match="seq_len_kv is missing"):
        TorchSdpaGraph(spec).execute(**inputs)


def test_random_inputs_are_never_zero():
    inputs = random_inputs(make(), "cpu")
    assert all(t.abs().sum() > 0 for t in inputs.values())


def test_torchs_fallback_on_a_gpu_never_picks_the_cudnn_kernel_install_serves():
    """install() serves aten's cuDNN SDPA op: the fallback (and the reference
    compiler's graphs) calling that kernel would come back to graphcache until
    the recursion limit, as an H200 showed (2026-12-04). Torch's kernel choice
    reads these flags, on any machine."""
    import types

    import torch

    from graphcache.compilers.torch_sdpa import not_cudnn

    assert torch.backends.cuda.cudnn_sdp_enabled()
    with not_cudnn(types.SimpleNamespace(is_cuda=True)):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled() and torch.backends.cuda.flash_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with not_cudnn(torch.zeros(1)):  # a CPU call never reaches that kernel: nothing changes
        assert torch.backends.cuda.cudnn_sdp_enabled()
