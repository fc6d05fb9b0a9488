"""Stand-ins for old cudnn-frontend versions (only 1.32 is installed here).

Each mimics one generation's SDPA keyword set and where it rejects an unknown
keyword: 1.7 and 1.12 at ``sdpa()`` (pybind's TypeError), 1.27+ when the
graph is lowered (its pure-Python pygraph records keywords and passes them on
later). They record what ``sdpa()`` received so tests can check the mask.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

COMMON = {
    "name",
    "q",
    "k",
    "v",
    "attn_scale",
    "use_padding_mask",
    "seq_len_q",
    "seq_len_kv",
    "dropout",
    "use_alibi_mask",
    "bias",
    "compute_data_type",
}
FE_1_7 = COMMON | {"is_inference", "use_causal_mask", "use_causal_mask_bottom_right", "sliding_window_length"}
FE_1_12 = FE_1_7 | {"diagonal_alignment", "diagonal_band_left_bound", "diagonal_band_right_bound"}
FE_1_27 = FE_1_12 | {"generate_stats"}
FE_1_3 = COMMON | {"is_inference", "use_causal_mask"}


class Tensor:
    def __init__(self, **attrs: Any) -> None:
        self.attrs = dict(attrs)

    def _set(self, name: str, value: Any) -> Tensor:
        self.attrs[name] = value
        return self

    def set_uid(self, uid: int) -> Tensor:
        return self._set("uid", uid)

    def set_output(self, flag: bool) -> Tensor:
        return self._set("output", flag)

    def set_dim(self, dim: list[int]) -> Tensor:
        return self._set("dim", dim)

    def set_stride(self, stride: list[int]) -> Tensor:
        return self._set("stride", stride)

    def set_data_type(self, dt: Any) -> Tensor:
        return self._set("data_type", dt)


def make_frontend(version: str, keywords: set[str], *, lazy: bool) -> SimpleNamespace:
    calls: list[dict[str, Any]] = []
    lowered: list[dict[str, Any]] = []

    class Graph:
        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs
            self.sdpa_kwargs: dict[str, Any] = {}

        def tensor(self, **attrs: Any) -> Tensor:
            return Tensor(**attrs)

        def sdpa(self, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
            unknown = set(kwargs) - keywords
            if unknown and not lazy:
                raise TypeError(f"sdpa(): incompatible function arguments: {sorted(unknown)}")
            self.sdpa_kwargs = kwargs
            calls.append(kwargs)
            stats = None if kwargs.get("is_inference", not kwargs.get("generate_stats")) else Tensor()
            return Tensor(), stats

        def validate(self) -> None:
            pass

        def build_operation_graph(self) -> None:
            unknown = set(self.sdpa_kwargs) - keywords
            if unknown:
                raise TypeError(f"sdpa(): unexpected keyword arguments {sorted(unknown)} (at lowering)")
            lowered.append(self.sdpa_kwargs)

        def create_execution_plans(self, modes: list[Any]) -> None:
            pass

        def check_support(self) -> None:
            pass

        def build_plans(self) -> None:
            pass

    return SimpleNamespace(
        __version__=version,
        pygraph=Graph,
        data_type=SimpleNamespace(HALF="half", BFLOAT16="bf16", FLOAT="float", INT32="int32", INT64="int64"),
        diagonal_alignment=SimpleNamespace(TOP_LEFT="TOP_LEFT", BOTTOM_RIGHT="BOTTOM_RIGHT"),
        heur_mode=SimpleNamespace(A="A", FALLBACK="FALLBACK"),
        calls=calls,
        lowered=lowered,
    )


def fe_1_3() -> SimpleNamespace:
    return make_frontend("1.3.0", FE_1_3, lazy=False)


def fe_1_7() -> SimpleNamespace:
    return make_frontend("1.7.0", FE_1_7, lazy=False)


def fe_1_12() -> SimpleNamespace:
    return make_frontend("1.12.0", FE_1_12, lazy=False)


def fe_1_27_lazy_old_keywords() -> SimpleNamespace:
    """A 1.27+-style lazy graph whose backend knows only the 1.12 keywords:
    the unknown generate_stats passes sdpa() and fails at lowering."""
    return make_frontend("1.27.0", FE_1_12, lazy=True)


def fe_1_27() -> SimpleNamespace:
    return make_frontend("1.27.0", FE_1_27, lazy=True)
