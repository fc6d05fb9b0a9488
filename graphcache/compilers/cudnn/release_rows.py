"""The release table's rows: the feature names (a contract, imported by name
through ``releases``), and for each, the oldest frontend and cuDNN that have
it, the compute capabilities it needs, and where the figure was read
(``source``: /work/shared/CUDNN_NOTES.md and its notes/). Versions are written
as the sources write them; ``releases`` is where they are parsed and compared.

``KNOWN_BAD``: the (cuDNN, compute capability, call shape) ``Window``s that must
not be served whatever a build says (a graph that builds, and passes its
check, and is wrong on other inputs), each with its source.

May import: nothing of the package.
"""

from __future__ import annotations

from dataclasses import dataclass

# -- feature names (a contract: other modules import these) -------------------

FUSED_ATTENTION = "fused_attention"
SERIALIZED_PLANS = "serialized_plans"
BOTTOM_RIGHT_FLAGS = "bottom_right_flags"
BEHAVIOR_NOTE_FILTER = "behavior_note_filter"
DIAGONAL_BAND = "diagonal_band"
GENERATE_STATS = "generate_stats"
DESERIALIZE_HANDLE = "deserialize_handle"
UID_KEYWORD = "uid_keyword"
ENFORCE_PRECOMPILED = "enforce_precompiled"
LAZY_KEYWORDS = "lazy_keywords"
PYTHON_ENGINES = "python_engines"
BYTES_PAYLOAD = "bytes_payload"
PYTHON_ENGINE_BLOBS = "python_engine_blobs"
OVERRIDE_FLAG = "override_flag"
SHAPE_OVERRIDE = "shape_override"
OVERRIDE_WORKSPACE = "override_workspace"
PADDING_MASK = "padding_mask"
PAGED = "paged"
PACKED_PAGE_TABLES = "packed_page_tables"
RAGGED = "ragged"
RAGGED_OVER_PAGED = "ragged_over_paged"
TOKEN_OFFSETS = "token_offsets"
CU_SEQ_LEN = "cu_seq_len"
CU_SEQ_LEN_MIXED = "cu_seq_len_mixed"
ZERO_LENGTH = "zero_length_sequences"
BIAS = "bias"
BIAS_OVERRIDE = "bias_override"
SINKS = "sinks"
SDPA_BACKWARD = "sdpa_backward"
BACKWARD_MASKS = "backward_masks"
BACKWARD_SINKS = "backward_sinks"


@dataclass(frozen=True)
class ArchFloor:
    """A higher cuDNN floor on GPUs whose compute capability is below ``below``."""

    below: str
    cudnn: str
    source: str


@dataclass(frozen=True)
class Feature:
    """One row of the table. Floors are written as the sources write them
    ("9.18.1", "1.24"); None means the feature does not depend on that part.
    ``attributes`` are the ``cudnn`` module names that first appear with it,
    for code that probes the module instead of its version (the dialects)."""

    name: str
    what: str
    source: str
    frontend: str | None = None
    cudnn: str | None = None
    min_cc: str | None = None
    arch_floors: tuple[ArchFloor, ...] = ()
    attributes: tuple[str, ...] = ()


# "THD (ragged offset) is only supported in Hopper and above" fires only when
# sm < 90 and cuDNN < 9.18.1: SM80/SM89 need 9.18.1, SM90+ have no such gate.
_RAGGED_SM8X = ArchFloor(
    "9.0", "9.18.1", "notes/ragged-paged.md Q1 'Versions and architectures' (sdpa_support_surface.h:346-351)"
)

ROWS = (
    # -- what graphcache needs at all (CudnnCompiler.preflight) --
    Feature(
        FUSED_ATTENTION,
        "cuDNN fused attention",
        "notes/ragged-paged.md Q2 'Architecture: SM80+' (the samples assert major >= 8)",
        min_cc="8.0",
    ),
    Feature(
        SERIALIZED_PLANS,
        "a serialized SDPA plan",
        "CUDNN_NOTES 'Packages' and 'Serialization': graphcache's plans are cuDNN 9.x runtime plans",
        cudnn="9.0",
    ),
    # -- SDPA keyword generations (dialects.py) --
    Feature(
        BOTTOM_RIGHT_FLAGS,
        "sdpa(use_causal_mask_bottom_right=, sliding_window_length=)",
        "CUDNN_NOTES 'Checked against the released bindings': 1.5 adds them",
        frontend="1.5",
    ),
    Feature(
        DIAGONAL_BAND,
        "sdpa(diagonal_alignment=) with band bounds",
        "CUDNN_NOTES 'Checked against the released bindings': cudnn.diagonal_alignment first exists in 1.10",
        frontend="1.10",
        attributes=("diagonal_alignment",),
    ),
    Feature(
        GENERATE_STATS,
        "sdpa(generate_stats=)",
        "CUDNN_NOTES 'SDPA keywords by frontend generation': 1.13 replaces is_inference",
        frontend="1.13",
    ),
    Feature(
        LAZY_KEYWORDS,
        "the Python pygraph (an unknown keyword fails only at lowering)",
        "CUDNN_NOTES 'SDPA keywords': from 1.27 cudnn.pygraph is pure Python",
        frontend="1.27",
    ),
    # -- building (build.py) --
    Feature(
        BEHAVIOR_NOTE_FILTER,
        "select_behavior_notes(RUNTIME_COMPILATION)",
        # CUDNN_NOTES says "bound from 1.5", but the real 1.3.0 binding has
        # pygraph.select_behavior_notes and behavior_note.RUNTIME_COMPILATION.
        "the 1.3.0 wheel (tests/test_frontend_versions.py); 1.3 is the oldest release checked",
        frontend="1.3",
        attributes=("behavior_note",),
    ),
    Feature(
        UID_KEYWORD,
        "graph.tensor(uid=)",
        "CUDNN_NOTES 'Build and execute': uid= keyword from 1.14, .set_uid() on every version",
        frontend="1.14",
    ),
    Feature(
        PYTHON_ENGINES,
        "a Python (CuTe DSL) engine (graph.selected_engine)",
        "CUDNN_NOTES 'Checked against the released bindings': 1.31/1.32 ship Python SDPA engines",
        frontend="1.31",
    ),
    # -- the stored blob (serialize.py) --
    Feature(
        DESERIALIZE_HANDLE,
        "deserialize(handle, data)",
        "CUDNN_NOTES 'Serialization': handle argument from 1.14",
        frontend="1.14",
    ),
    Feature(
        ENFORCE_PRECOMPILED,
        "deserialize(enforce_precompiled=)",
        "CUDNN_NOTES 'Serialization': enforce_precompiled= from 1.26",
        frontend="1.26",
    ),
    Feature(
        BYTES_PAYLOAD,
        "serialize(as_bytes=True) (and bytes to deserialize)",
        "CUDNN_NOTES 'Serialization': 1.32 adds as_bytes and takes bytes; 1.23 and earlier refuse bytes",
        frontend="1.32",
    ),
    Feature(
        PYTHON_ENGINE_BLOBS,
        "serialize() of a Python-engine plan",
        "CUDNN_NOTES 'Checked against the released bindings': 1.32 emits a CUDNN_FE_PYPLAN blob",
        frontend="1.32",
    ),
    # -- execute-time shape override (length classes) --
    Feature(
        OVERRIDE_FLAG,
        "pygraph(is_override_shape_enabled=)",
        "notes/shape-classes.md §2: frontend v1.20.0, 'Override shape support requires cudnn 9.21.0 and above'",
        frontend="1.20",
        cudnn="9.21",
    ),
    Feature(
        SHAPE_OVERRIDE,
        "execute-time shape override",
        "notes/shape-classes.md §1 'Pitfall' and §2: Python execute() drops the override lists in 1.18-1.23, "
        "forwards them from 1.24; the flag needs cuDNN 9.21.0",
        frontend="1.24",
        cudnn="9.21",
    ),
    Feature(
        OVERRIDE_WORKSPACE,
        "get_workspace_size(override_shapes=)",
        "notes/shape-classes.md §1 'Workspace with overrides': 'Runtime workspace query with override shapes "
        "requires cuDNN v9.23.0' (W124, W132)",
        frontend="1.24",
        cudnn="9.23",
    ),
    # -- length classes without override: declared at the class's maxima, the real lengths as the padding
    # mask's seq-len tensors (graphcache/compilers/padded.py)
    Feature(
        PADDING_MASK,
        "sdpa(use_padding_mask=, seq_len_q=, seq_len_kv=), the real lengths of a graph declared longer",
        "cudnn-frontend v1.0.0 python_bindings/pygraph/sdpa.cpp (use_padding_mask, seq_len_q, seq_len_kv) and "
        "include/cudnn_frontend/node/scaled_dot_product_flash_attention.h (bmm1 and bmm2 take the seq-len "
        "tensors as their m/n/k overrides, the scores past them are masked); v1.23.0's causal_mask_bottom_right "
        "and sliding_window_mask read the same tensors, so bottom-right alignment follows the real lengths; "
        "graphcache's plans need cuDNN 9.0",
        frontend="1.0",
        cudnn="9.0",
    ),
    # -- an additive score bias (attn_mask tensors) --
    Feature(
        BIAS,
        "sdpa(bias=), an additive score bias",
        "cudnn-frontend v1.0.0 python_bindings/pygraph/sdpa.cpp (bias=) and the flash node's pointwise ADD; "
        "its test_mhas.py runs a (1, h, s_q, s_kv) bias from cuDNN 8.9.3; graphcache's plans need 9.0",
        frontend="1.0",
        cudnn="9.0",
    ),
    Feature(
        BIAS_OVERRIDE,
        "a bias under execute-time shape override",
        "1.32 wheel node/sdpa_support_surface.h: the unified SDPA node (the override engine, "
        "notes/shape-classes.md §2) takes a Bias input from cuDNN 9.21.0; override itself needs FE 1.24",
        frontend="1.24",
        cudnn="9.21",
    ),
    # -- attention sinks (gpt-oss's s_aux) --
    Feature(
        SINKS,
        "sdpa(sink_token=), per-head float32 (1, h_q, 1, 1) sink logits",
        "cudnn-frontend source: SDPA_attributes::set_sink_token from v1.14.0 (release notes, sample "
        "fp16_fwd_with_sink_token.cpp); the Python sdpa(sink_token=) from v1.19.0 (python/pygraph/sdpa.cpp); "
        "node/scaled_dot_product_flash_attention.h: 'SDPA with sink_token is not supported before 9.13'; "
        "node/sdpa_support_surface.h: backend engines refuse s_q == 1 with a sink (1.32's python engines may take it)",
        frontend="1.19",
        cudnn="9.13",
    ),
    # -- SDPA backward graphs (kind "backward", cudnn/backward.py) --
    Feature(
        SDPA_BACKWARD,
        "sdpa_backward(q, k, v, o, dO, stats), the fused SDPA backward",
        'cudnn-frontend v1.0.0 python_bindings/pygraph/sdpa.cpp .def("sdpa_backward") (attn_scale, bias, dBias, '
        "use_padding_mask, seq_len_q/kv, use_causal_mask, dropout) and docs/operations/Attention.md 'Scaled Dot "
        "Product Attention Backward' (GQA/MQA as the forward); graphcache's plans need cuDNN 9.0. The frontend "
        "itself refuses cuDNN 9.10.0/9.10.1 (from v1.19.0 only) and s_q = s_kv = 1 (from v1.16.0; graphcache "
        "refuses it on every frontend) (v1.23.0 include/cudnn_frontend/node/"
        "scaled_dot_product_flash_attention.h, CompositeSDPABackwardNode::pre_validate_node)",
        frontend="1.0",
        cudnn="9.0",
        min_cc="8.0",
    ),
    Feature(
        BACKWARD_MASKS,
        "sdpa_backward(use_causal_mask_bottom_right=, sliding_window_length=)",
        "cudnn-frontend python/pygraph/sdpa.cpp, sdpa_backward's py::arg list read at every tag v1.0.0-v1.23.0: "
        "1.5.0 adds use_causal_mask_bottom_right, sliding_window_length and use_deterministic_algorithm, 1.8.0 "
        "max_total_seq_len_q/kv, 1.10.0 diagonal_alignment and the band bounds (as sdpa: the dialect chain "
        "serves both); bottom-right needs s_q, s_kv multiples of 64 below cuDNN 9.6.0 and takes no bias or "
        "dropout (CompositeSDPABackwardNode::pre_validate_node, v1.23.0)",
        frontend="1.5",
    ),
    Feature(
        BACKWARD_SINKS,
        "sdpa_backward(sink_token=, dSink_token=) (not served: graphcache's backward specs take no sinks)",
        "cudnn-frontend v1.19.0 python/pygraph/sdpa.cpp adds sink_token, dSink_token, score_mod and "
        "score_mod_bprop to sdpa_backward; cuDNN >= 9.13 as the forward's sinks",
        frontend="1.19",
        cudnn="9.13",
    ),
    # -- ragged and paged (serving engines) --
    Feature(
        PAGED,
        "a paged K/V cache",
        "notes/ragged-paged.md Q2 'Versions and architectures': cuDNN >= 9.5.0 at compile and run time, FE >= 1.8",
        frontend="1.8",
        cudnn="9.5",
        min_cc="8.0",
    ),
    Feature(
        PACKED_PAGE_TABLES,
        "a packed (ragged-offset) page table",
        "notes/ragged-paged.md Q2 'Packed (ragged) page tables': cuDNN >= 9.10.2, FE v1.12",
        frontend="1.12",
        cudnn="9.10.2",
        min_cc="8.0",
    ),
    Feature(
        RAGGED,
        "a ragged (THD) layout",
        "notes/ragged-paged.md Q1 'Versions and architectures': FE v1.1, "
        "CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC requires cudnn 8.9",
        frontend="1.1",
        cudnn="8.9",
        min_cc="8.0",
        arch_floors=(_RAGGED_SM8X,),
    ),
    Feature(
        RAGGED_OVER_PAGED,
        "ragged q over a paged K/V cache",
        "notes/ragged-paged.md Q2 'Combinations': allowed from cuDNN 9.7.0 (FE v1.11 notes); "
        "notebook 52 reports packed q unreliable before 9.10.0",
        frontend="1.11",
        cudnn="9.7",
        min_cc="8.0",
        arch_floors=(_RAGGED_SM8X,),
    ),
    Feature(
        TOKEN_OFFSETS,
        "set_ragged_offset_multiplier (token-unit ragged offsets)",
        "notes/ragged-paged.md Q1 'Token-unit offsets': cuDNN 9.24.0, FE 1.25 (PR #300); unified fprop only",
        frontend="1.25",
        cudnn="9.24",
        min_cc="8.0",
        arch_floors=(_RAGGED_SM8X,),
    ),
    Feature(
        CU_SEQ_LEN,
        "sdpa(cu_seq_len_q=, cu_seq_len_kv=) prefix sums",
        "notes/ragged-paged.md Q1 'Mandatory companions' (cuDNN 9.24+, unified) and Q5 FlashInfer / PyTorch "
        "#194906 (FE >= 1.25)",
        frontend="1.25",
        cudnn="9.24",
        min_cc="8.0",
    ),
    Feature(
        ZERO_LENGTH,
        "zero-length sequences in a ragged or paged batch",
        "cudnn-frontend's own tests (test/python/sdpa, test_thd_zero_seqlen): skipped below 9.25.0, 'zero "
        "sequence length SDPA requires cuDNN >= 9.25.0'; cudnn-frontend#943 (NaN rows, H200, 9.22)",
        cudnn="9.25",
    ),
    Feature(
        CU_SEQ_LEN_MIXED,
        "cu_seq_len on one side with seq_len on the other",
        "notes/ragged-paged.md Q1 'Mandatory companions' (9.25+ for different forms) and Q5 FlashInfer "
        "_cudnn_supports_direct_seqlens (FE >= 1.27)",
        frontend="1.27",
        cudnn="9.25",
        min_cc="8.0",
    ),
)


# -- known-bad windows: combinations no door may serve -------------------------------


@dataclass(frozen=True)
class Window:
    """A window of cuDNN releases and compute capabilities where a call
    shape must not be served, whatever a build or its check says. cuDNN
    from ``cudnn_from`` through ``cudnn_through`` (both included; or below
    ``cudnn_below``) but ``except_cudnn``; compute capability from ``cc_from`` up to (not
    including) ``cc_below``; the call shape: ``seq_q`` (1: decode), the
    ``layouts`` it applies to (empty: every one), ``gqa`` (True: fewer key/value
    heads than query heads). ``source`` says where the window was read."""

    name: str
    what: str
    source: str
    cudnn_from: str | None = None
    cudnn_through: str | None = None
    cudnn_below: str | None = None
    except_cudnn: tuple[str, ...] = ()
    cc_from: str | None = None
    cc_below: str | None = None
    seq_q: int | None = None
    layouts: tuple[str, ...] = ()
    gqa: bool | None = None


KNOWN_BAD = (
    Window(
        "cudnn_decode_sm10x",
        "cuDNN SDPA decode (seq_q 1) on SM 10.x and 11.x with cuDNN 9.19 to 9.25.0, 9.24.1 excepted: "
        "it silently corrupts greedy generation (B200, fewer than 8 KV heads)",
        "pytorch#194927 check_cudnn_sdpa_decode ('cuDNN SDPA decode is disabled for cuDNN versions 9.19-9.25.0 "
        "(except 9.24.1) on SM 10.x and 11.x'); pytorch#193893 (B200, torch 2.13, cuDNN 9.20: BBH 45.2 vs 82.0 "
        "with math); notes/pytorch-door.md 'Known-bad windows'",
        cudnn_from="9.19.0",
        cudnn_through="9.25.0",
        except_cudnn=("9.24.1",),
        cc_from="10.0",
        cc_below="12.0",
        seq_q=1,
    ),
    Window(
        "cudnn_ragged_gqa_decode",
        "single-token GQA rows of a ragged (thd) batch with cuDNN below 9.27 (here: a thd decode batch, seq_q 1, "
        "with fewer key/value heads than query heads; a spec cannot tell which rows of a mixed batch are single-token)",
        "FlashInfer keeps single-token GQA ragged rows off cuDNN below 9.27 (NVBug 6783545); "
        "notes/pytorch-door.md 'Known-bad windows'",
        cudnn_below="9.27",
        seq_q=1,
        layouts=("thd",),
        gqa=True,
    ),
)
