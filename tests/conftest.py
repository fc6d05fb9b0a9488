from __future__ import annotations

import pytest


def _gpu_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "needs a CUDA GPU: torch is not installed"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU: none is visible to torch on this machine"
    try:
        import cudnn  # noqa: F401
    except ImportError:
        return "needs nvidia-cudnn-frontend, which is not installed"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
