"""Target: the machine a serialized plan can be loaded on."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from graphcache.errors import NoGpu, TargetError

FORM = "GPU-smMAJORMINOR-cudnnX.Y.Z-feX.Y.Z (for example h200-sm90-cudnn9.28.0-fe1.32.0)"
_VERSION = r"\d+(?:\.\d+){1,3}"
_TEXT = re.compile(rf"^(?P<gpu>[a-z0-9_]+)-sm(?P<sm>\d{{2,3}})-cudnn(?P<cudnn>{_VERSION})-fe(?P<fe>{_VERSION})$")
_GPU = re.compile(r"^[a-z0-9_]+$")
_CC = re.compile(r"^\d{1,2}\.\d$")
_NOISE = ("nvidia", "geforce", "tesla", "quadro")


def normalise_gpu_name(name: str) -> str:
    """'NVIDIA H200' -> 'h200'; 'NVIDIA A100-SXM4-80GB' -> 'a100_sxm4_80gb'."""
    words = re.split(r"[^a-z0-9]+", name.lower())
    kept = [w for w in words if w and w not in _NOISE]
    return "_".join(kept) or "unknown"


def cudnn_version_text(number: int) -> str:
    """cuDNN's integer version (90100 or 8902) as 'major.minor.patch'."""
    if number >= 90000:
        return f"{number // 10000}.{number % 10000 // 100}.{number % 100}"
    return f"{number // 1000}.{number % 1000 // 100}.{number % 100}"


@dataclass(frozen=True)
class Target:
    """GPU model, compute capability, cuDNN and cudnn-frontend versions.

    A blob built for one target is never handed to another: cuDNN plans need
    an identical GPU and the same cuDNN. Text form:
    ``h200-sm90-cudnn9.28.0-fe1.32.0``.
    """

    gpu: str
    compute_capability: str
    cudnn: str
    frontend: str

    def __post_init__(self) -> None:
        if not _GPU.match(self.gpu):
            raise TargetError(f"gpu={self.gpu!r} must be lowercase letters, digits and _")
        if not _CC.match(self.compute_capability):
            raise TargetError(f"compute_capability={self.compute_capability!r} must look like '9.0'")
        for name in ("cudnn", "frontend"):
            if not re.fullmatch(_VERSION, getattr(self, name)):
                raise TargetError(f"{name}={getattr(self, name)!r} must look like '9.28.0'")

    @property
    def sm(self) -> str:
        return "sm" + self.compute_capability.replace(".", "")

    def __str__(self) -> str:
        return f"{self.gpu}-{self.sm}-cudnn{self.cudnn}-fe{self.frontend}"

    @classmethod
    def parse(cls, text: str) -> Target:
        """Parse the text form. Raises TargetError showing the expected form."""
        match = _TEXT.match(text.strip()) if isinstance(text, str) else None
        if not match:
            raise TargetError(f"target {text!r} is malformed; expected {FORM}")
        sm = match["sm"]
        return cls(
            gpu=match["gpu"],
            compute_capability=f"{int(sm[:-1])}.{sm[-1]}",
            cudnn=match["cudnn"],
            frontend=match["fe"],
        )

    def to_dict(self) -> dict[str, str]:
        return {
            "gpu": self.gpu,
            "compute_capability": self.compute_capability,
            "cudnn": self.cudnn,
            "frontend": self.frontend,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Target:
        if not isinstance(data, dict) or set(data) != {
            "gpu",
            "compute_capability",
            "cudnn",
            "frontend",
        }:
            raise TargetError(f"target mapping {data!r} needs exactly gpu, compute_capability, cudnn, frontend")
        return cls(**data)

    @classmethod
    def detect(cls, device: int = 0) -> Target:
        """This machine's target (GPU ``device``).

        Raises:
            NoGpu: torch is missing, has no CUDA, or sees no GPU; or the
                cudnn-frontend / cuDNN runtime is missing.
        """
        torch = _import_torch()
        if not torch.cuda.is_available():
            raise NoGpu(
                "no CUDA GPU found (torch.cuda.is_available() is False); building and "
                "loading cuDNN graphs needs one. Name another machine's target with "
                "--target to read its artifacts."
            )
        major, minor = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
        try:
            import cudnn  # type: ignore[import-not-found]
        except ImportError as exc:
            raise NoGpu("nvidia-cudnn-frontend is not installed: pip install 'graphcache[gpu]'") from exc
        try:
            cudnn_text = cudnn.backend_version_string()
        except (AttributeError, RuntimeError):
            try:
                cudnn_text = cudnn_version_text(int(cudnn.backend_version()))
            except Exception as exc:  # noqa: BLE001 - any failure means no runtime
                raise NoGpu(f"the cuDNN runtime library was not found: {exc}") from exc
        return cls(
            gpu=normalise_gpu_name(name),
            compute_capability=f"{major}.{minor}",
            cudnn=cudnn_text,
            frontend=cudnn.__version__.split("+")[0],
        )


def runtime_info() -> dict[str, Any]:
    """CUDA runtime and driver versions: recorded in headers, not in keys."""
    info: dict[str, Any] = {}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda_runtime"] = torch.version.cuda
        if torch.cuda.is_available():
            info["gpu_name"] = torch.cuda.get_device_name(0)
            try:
                info["driver"] = torch.cuda.driver_version()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - older torch has no such call
                pass
    except ImportError:
        pass
    return info


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise NoGpu("torch is not installed, so no GPU can be used: pip install 'graphcache[gpu]'") from exc
    return torch
