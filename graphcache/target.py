"""Target: the machine a serialized plan can be loaded on."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from graphcache.errors import NoGpu, TargetError

FORM = (
    "GPU-smMAJORMINOR[-mpSMS]-cudnnX.Y.Z-feX.Y.Z (for example h200-sm90-mp132-cudnn9.28.0-fe1.32.0; "
    "`graphcache doctor` on the GPU host prints its own)"
)
_VERSION = r"\d+(?:\.\d+){1,3}"
_TEXT = re.compile(
    rf"^(?P<gpu>[a-z0-9_]+)-sm(?P<sm>\d{{2,3}})(?:-mp(?P<mp>\d{{1,4}}))?-cudnn(?P<cudnn>{_VERSION})-fe(?P<fe>{_VERSION})$",
    re.ASCII,  # \d: 0-9 only, as PATTERN
)
# The text form as a plain pattern (no named groups), for OpenAPI and other validators.
PATTERN = r"^[a-z0-9_]+-sm[0-9]{2,3}(-mp[0-9]{1,4})?-cudnn[0-9]+(\.[0-9]+){1,3}-fe[0-9]+(\.[0-9]+){1,3}$"
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
    """GPU model, compute capability, multiprocessor count, cuDNN and
    cudnn-frontend versions.

    A blob built for one target is never handed to another: cuDNN plans need
    an identical GPU and the same cuDNN. ``sm_count`` tells apart GPUs that
    share a name but not a size (another SKU, a MIG slice): heuristics and
    plans depend on it. A detected target always has it; a target named by
    hand without ``-mpN`` has None and so different keys. Text form:
    ``h200-sm90-mp132-cudnn9.28.0-fe1.32.0``.
    """

    gpu: str
    compute_capability: str
    cudnn: str
    frontend: str
    sm_count: int | None = None

    def __post_init__(self) -> None:
        if not _GPU.match(self.gpu):
            raise TargetError(f"gpu={self.gpu!r} must be lowercase letters, digits and _")
        if not _CC.match(self.compute_capability):
            raise TargetError(f"compute_capability={self.compute_capability!r} must look like '9.0'")
        for name in ("cudnn", "frontend"):
            if not isinstance(getattr(self, name), str) or not re.fullmatch(_VERSION, getattr(self, name)):
                raise TargetError(f"{name}={getattr(self, name)!r} must look like '9.28.0'")
        if self.sm_count is not None and (
            isinstance(self.sm_count, bool) or not isinstance(self.sm_count, int) or not 0 < self.sm_count < 10000
        ):
            raise TargetError(f"sm_count={self.sm_count!r} must be the GPU's multiprocessor count, e.g. 132")

    @property
    def sm(self) -> str:
        return "sm" + self.compute_capability.replace(".", "")

    def __str__(self) -> str:
        mp = "" if self.sm_count is None else f"-mp{self.sm_count}"
        return f"{self.gpu}-{self.sm}{mp}-cudnn{self.cudnn}-fe{self.frontend}"

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
            sm_count=None if match["mp"] is None else int(match["mp"]),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "compute_capability": self.compute_capability,
            "cudnn": self.cudnn,
            "frontend": self.frontend,
            "sm_count": self.sm_count,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Target:
        required = {"gpu", "compute_capability", "cudnn", "frontend"}
        if not isinstance(data, dict) or not required <= set(data) <= required | {"sm_count"}:
            raise TargetError(
                f"target mapping {data!r} needs exactly gpu, compute_capability, cudnn, frontend (and sm_count)"
            )
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
                "no CUDA GPU found (torch.cuda.is_available() is False); building and loading cuDNN graphs needs one. "
                f"Without a GPU: {REFERENCE_HINT}"
            )
        major, minor = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
        sm_count = int(torch.cuda.get_device_properties(device).multi_processor_count)
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
            sm_count=sm_count,
        )


def runtime_info(device: int = 0) -> dict[str, Any]:
    """CUDA runtime and driver versions and the name of GPU ``device`` (the
    one that built): recorded in headers, not in keys."""
    info: dict[str, Any] = {}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda_runtime"] = torch.version.cuda
        if torch.cuda.is_available():
            info["gpu_name"] = torch.cuda.get_device_name(device)
            try:
                info["driver"] = torch.cuda.driver_version()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - older torch has no such call
                pass
    except ImportError:
        pass
    return info


# What a machine without a GPU runs instead (graphcache.compilers.reference): the fix a NoGpu names.
REFERENCE_HINT = (
    "the reference compiler builds on the CPU: --compiler reference (GRAPHCACHE_COMPILER=reference; "
    "GraphCache(store, compiler='reference') in code), its graphs filed under a target of their own"
)


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise NoGpu(
            f"torch is not installed, so no GPU can be used: pip install 'graphcache[gpu]'; or {REFERENCE_HINT}"
        ) from exc
    return torch
