"""graphcache.torch.install() beside the other providers of PyTorch's cuDNN
SDPA door (issue 42, item 6): cudnn-frontend's own provider, installed by
``cudnn.torch.install_sdpa_overrides()`` or torch 2.13's flash-attention
registry (``activate_flash_attention_impl("CUDNN")``), and torch's Python
route (``torch.backends.cuda.enable_cudnn_sdp_python``, torch main). One
serves, the last registered (torch's dispatcher); graphcache's install goes
on top with a warning naming the other; a provider registered over
graphcache's since is named by ``kernels()`` and ``stats()``, with a warning.

Tested with the real ``cudnn.torch`` module of the installed frontend 1.32:
its registrations at the CUDA key are real on a CPU build of torch and on a
CUDA build without a GPU alike (their kernels are never called here). What
serves the key once every provider is gone is torch's own: nothing on a CPU
build (the suite's lock), torch's C++ kernel on a CUDA build (PyPI's torch
for Linux). Only torch's Python route is stood in for: torch 2.13 has no
``enable_cudnn_sdp_python``.
"""

from __future__ import annotations

import logging
import warnings

import pytest

torch = pytest.importorskip("torch", reason="graphcache.torch needs torch")
cudnn_torch = pytest.importorskip("cudnn.torch", reason="needs nvidia-cudnn-frontend 1.32 (its cudnn.torch provider)")

import graphcache.torch as gt  # noqa: E402
from graphcache.torch.aten import install as door  # noqa: E402

PROVIDER = "cudnn/torch/sdpa_provider.py"


@pytest.fixture(autouse=True)
def clean():
    gt.uninstall()
    yield
    gt.uninstall()
    if torch.nn.attention.current_flash_attention_impl() is not None:
        torch.nn.attention.restore_flash_attention_impl()


def served_by() -> str:
    """The file torch's dispatcher names for the CUDA kernel of the forward op."""
    return door.owner("CUDA") or ""


TORCH_OWN = served_by()  # read at import, before any test registers a provider


def test_with_no_provider_torchs_own_kernel_serves_the_cuda_key():
    if torch.version.cuda is None:  # a CPU build registers no CUDA kernel for the op
        assert TORCH_OWN == ""
    else:  # a CUDA build's own, from its generated C++ registrations (RegisterCUDA_0.cpp)
        assert TORCH_OWN.endswith(".cpp") and door.describe(TORCH_OWN) == "PyTorch's own kernel"
    with gt.install(dispatch_key="CUDA"):
        assert served_by() == door.HERE
    assert served_by() == TORCH_OWN


def test_install_over_cudnn_frontends_provider_warns_naming_it_and_gives_it_back():
    provider = cudnn_torch.install_sdpa_overrides()
    try:
        assert served_by().endswith(PROVIDER)
        with pytest.warns(UserWarning, match=r"cudnn-frontend's SDPA provider .*install_sdpa_overrides\(\)"):
            handle = gt.install(dispatch_key="CUDA")
        assert gt.kernels() == {"CUDA": "graphcache"} and served_by() == door.HERE
        handle.uninstall()
        assert served_by().endswith(PROVIDER)  # exactly what was there: the provider's kernels serve again
    finally:
        provider.remove()
    assert served_by() == TORCH_OWN  # torch's own again: none on a CPU build


def test_a_provider_activated_after_install_is_named_and_install_again_wins(caplog):
    handle = gt.install(dispatch_key="CUDA")
    torch.nn.attention.activate_flash_attention_impl("CUDNN")  # torch 2.13's registry route: cudnn.torch's kernels
    assert served_by().endswith(PROVIDER)
    with caplog.at_level(logging.WARNING, logger="graphcache.torch.aten.install"):
        shadowed = gt.stats()["kernels"]["CUDA"]
    assert 'activate_flash_attention_impl("CUDNN")' in shadowed and "cudnn-frontend's SDPA provider" in shadowed
    assert "shadowed by cudnn-frontend's SDPA provider" in caplog.text
    with pytest.warns(UserWarning, match="activate_flash_attention_impl"):
        again = gt.install(dispatch_key="CUDA")
    assert gt.kernels() == {"CUDA": "graphcache"}
    again.uninstall()
    assert served_by() == door.HERE  # one installation still held
    handle.uninstall()
    assert served_by().endswith(PROVIDER)
    torch.nn.attention.restore_flash_attention_impl()
    assert served_by() == TORCH_OWN


def test_torch_s_python_route_is_named_where_torch_has_it(monkeypatch):
    # Stands in for torch main's switch (pytorch#195981, torch/nn/attention/_cudnn.py): torch 2.13 has no
    # torch.backends.cuda.enable_cudnn_sdp_python. Enabling it calls cudnn.torch's install_sdpa_overrides,
    # the real call made here; cudnn_sdp_python_enabled() then answers True.
    monkeypatch.setattr(torch.backends.cuda, "cudnn_sdp_python_enabled", lambda: True, raising=False)
    provider = cudnn_torch.install_sdpa_overrides()
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            gt.install(dispatch_key="CUDA")
        (warned,) = [w for w in seen if "graphcache.torch.install()" in str(w.message)]
        assert "torch.backends.cuda.enable_cudnn_sdp_python(True)" in str(warned.message)
        gt.uninstall()
    finally:
        provider.remove()


def test_no_warning_where_no_other_provider_is_registered():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with gt.install(dispatch_key="CUDA"):
            assert gt.kernels() == {"CUDA": "graphcache"}
    assert served_by() == TORCH_OWN
