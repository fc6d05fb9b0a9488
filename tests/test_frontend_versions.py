"""graphcache's dialect chain inside the real old cudnn-frontend bindings, on CPU.

scripts/tools/old_frontends.sh installs each release below (and a shared cuDNN
runtime) under .cache/old-frontends (or $GRAPHCACHE_OLD_FRONTENDS); each test
runs tests/frontend_probe.py in a subprocess with that release first on
PYTHONPATH. Without the install the tests skip and say how to get it.

What runs without a GPU (docs/frontends.md): every release builds the Python
graph and calls ``sdpa()``; ``validate()`` runs on 1.3-1.9 and 1.31, and on
1.10-1.30 fails with "CUDA driver version is insufficient" after the
keywords reached cuDNN (1.27-1.30 lower them to C++ there first, so their
lazy TypeError is seen for real). So the assertions are: which dialects the
binding refused with TypeError, which reached ``validate()``, and with which
mask keywords.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests import cudnn_standins as fe

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("GRAPHCACHE_OLD_FRONTENDS", REPO / ".cache" / "old-frontends"))
RUNTIME_LIB = CACHE / "runtime" / "nvidia" / "cudnn" / "lib"
# Keep in step with scripts/tools/old_frontends.sh (FRONTENDS).
FRONTENDS = ("1.3.0", "1.5.0", "1.7.0", "1.9.0", "1.10.0", "1.12.0", "1.24.0", "1.27.0", "1.28.0", "1.31.0")

BASE = {"batch": 2, "heads_q": 8, "seq_q": 128, "head_dim": 64}
MASKS = {
    "none": {"mask": "none"},
    "causal": {"mask": "causal"},
    "causal_bottom_right": {"mask": "causal_bottom_right", "seq_q": 64},
    "window": {"mask": "sliding_window", "window_left": 32},
    "window_right": {"mask": "sliding_window", "window_left": 32, "window_right": 8},
}
REFUSED = "TypeError: sdpa(): incompatible function arguments"
NO_DRIVER = "CUDA driver version is insufficient"

# The mask keywords each dialect must hand sdpa() for each mask (window of 32
# keys to the left: cuDNN's left bound counts the diagonal, 33).
BAND = {
    "none": {},
    "causal": {"diagonal_alignment": "TOP_LEFT", "diagonal_band_right_bound": 0},
    "causal_bottom_right": {"diagonal_alignment": "BOTTOM_RIGHT", "diagonal_band_right_bound": 0},
    "window": {"diagonal_alignment": "TOP_LEFT", "diagonal_band_left_bound": 33, "diagonal_band_right_bound": 0},
    "window_right": {"diagonal_alignment": "TOP_LEFT", "diagonal_band_left_bound": 33, "diagonal_band_right_bound": 8},
}
FLAGS = {
    "none": {},
    "causal": {"use_causal_mask": True},
    "causal_bottom_right": {"use_causal_mask_bottom_right": True},
    "window": {"use_causal_mask": True, "sliding_window_length": 33},
}

# Per release: the dialect whose keywords the binding accepted (None: none
# could express the mask), and how validate() ends on this CPU.
CHOSEN: dict[str, dict[str, str | None]] = {
    "1.3.0": {"none": "causal_flags", "causal": "causal_flags"},
    **{v: {m: "causal_flags" for m in FLAGS} for v in ("1.5.0", "1.7.0", "1.9.0")},
    **{v: {m: "diagonal_band_is_inference" for m in MASKS} for v in ("1.10.0", "1.12.0")},
    **{v: {m: "diagonal_band" for m in MASKS} for v in ("1.24.0", "1.27.0", "1.28.0", "1.31.0")},
}
VALIDATE_RUNS = {"1.3.0", "1.5.0", "1.7.0", "1.9.0", "1.31.0"}


def _has_driver() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


# What validate() and later steps do here is what a machine without an NVIDIA
# driver does; with one they go further, and only the dialect choice is asserted.
NO_DRIVER_HERE = not _has_driver()
needs_no_driver = pytest.mark.skipif(not NO_DRIVER_HERE, reason="records a machine without an NVIDIA driver")


def _installed(version: str) -> bool:
    return (CACHE / f"fe-{version}" / ".complete").exists() and (CACHE / "runtime" / ".complete").exists()


@cache
def _probe(version: str, lower: bool = False, future: bool = False) -> dict[str, Any]:
    if not _installed(version):
        pytest.skip(f"cudnn-frontend {version} is not installed under {CACHE}: run scripts/tools/old_frontends.sh")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(CACHE / f"fe-{version}"), str(REPO)]),
        "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(RUNTIME_LIB), os.environ.get("LD_LIBRARY_PATH")])),
    }
    job = {"specs": [{**BASE, **m} for m in MASKS.values()], "lower": lower, "future": future}
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "frontend_probe.py"), json.dumps(job)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["describe"]["version"] == version  # the release we meant, not the installed 1.32
    return out


def _result(version: str, mask: str, **job: bool) -> dict[str, Any]:
    return _probe(version, **job)["results"][list(MASKS).index(mask)]


def _mask_words(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k.startswith(("diagonal", "use_causal", "sliding"))}


@pytest.mark.parametrize("version", FRONTENDS)
def test_standin_tables_match_the_real_binding(version):
    real = _probe(version)["describe"]
    release = fe.RELEASES[version]
    assert tuple(real["sdpa_keywords"]) == release.sdpa_keywords
    assert set(real["required"]) == release.required
    assert {a for a in fe.WATCHED if a in real["attrs"]} == set(release.attrs)
    standin = fe.standin(version)
    assert {a for a in fe.WATCHED if hasattr(standin, a)} == set(release.attrs)
    assert (real["deserialize_takes_handle"], real["deserialize_enforce"]) == (
        release.deserialize_takes_handle,
        release.deserialize_enforce,
    )


def _table_agrees(described: dict[str, Any]) -> None:
    """The release table's frontend-only rows against what the binding has."""
    from graphcache.compilers.cudnn import releases as r

    version, attrs, keywords = described["version"], set(described["attrs"]), set(described["sdpa_keywords"])
    assert r.available(r.BOTTOM_RIGHT_FLAGS, version) == ("use_causal_mask_bottom_right" in keywords)
    assert (
        r.available(r.DIAGONAL_BAND, version) == ("diagonal_alignment" in attrs) == ("diagonal_alignment" in keywords)
    )
    assert r.available(r.GENERATE_STATS, version) == ("generate_stats" in keywords)
    assert r.available(r.BEHAVIOR_NOTE_FILTER, version) == ("behavior_note" in attrs)
    assert r.available(r.DESERIALIZE_HANDLE, version) == described["deserialize_takes_handle"]
    assert r.available(r.ENFORCE_PRECOMPILED, version) == described["deserialize_enforce"]


@pytest.mark.parametrize("version", FRONTENDS)
def test_release_table_matches_the_real_binding(version):
    _table_agrees(_probe(version)["describe"])


@pytest.mark.cudnn
def test_release_table_matches_the_installed_binding():
    cudnn = pytest.importorskip("cudnn")
    from tests.frontend_probe import describe

    _table_agrees(describe(cudnn))


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("version", FRONTENDS)
def test_dialect_chain_in_the_real_binding(version, mask):
    result = _result(version, mask)
    calls = result["calls"]
    chosen = CHOSEN[version].get(mask)
    if version in ("1.3.0", "1.5.0", "1.7.0", "1.9.0"):
        # 1.5-1.9 (and 1.3) have no cudnn.diagonal_alignment: both band dialects decline
        # without calling sdpa(), the chain goes on to the causal flags (defect 1).
        assert all("diagonal_alignment" not in c["kwargs"] for c in calls)
    if chosen is None:
        assert result["outcome"] == "error" and result["error_type"] == "UnsupportedSpec"
        assert f"cudnn-frontend {version} cannot express mask" in result["error"]
        assert all(c["sdpa"].startswith(REFUSED) for c in calls)  # nothing built with the mask dropped
        return
    accepted = [c for c in calls if c["sdpa"] == "ok"]
    assert len(accepted) == 1, calls
    assert all(c["sdpa"].startswith(REFUSED) for c in calls[:-1])
    assert accepted[0] is calls[-1]
    words = _mask_words(accepted[0]["kwargs"])
    if chosen == "causal_flags":
        assert words == FLAGS[mask]
        assert accepted[0]["kwargs"]["is_inference"] is True
    else:
        assert words == BAND[mask]
        stats_word = "generate_stats" if chosen == "diagonal_band" else "is_inference"
        assert stats_word in accepted[0]["kwargs"]
    if not NO_DRIVER_HERE:
        return
    if version in VALIDATE_RUNS:
        assert accepted[0]["validate"] == "ok"
        assert result["outcome"] == "built" and result["dialect"] == chosen
        assert result["steps"] == ["validate"]
    else:
        # The keywords reached cuDNN (1.27/1.28 lowered them to C++ first); the device check failed.
        assert NO_DRIVER in accepted[0]["validate"]
        assert result["outcome"] == "error" and NO_DRIVER in result["error"] and "at validate" in result["error"]


@needs_no_driver
@pytest.mark.parametrize("version", ["1.12.0", "1.24.0", "1.28.0"])
def test_missing_driver_is_not_recorded_as_unsupported(version):
    # A missing driver is about this host, never a negative entry for the target.
    result = _result(version, "causal")
    assert NO_DRIVER in result["error"] and result["error_type"] != "UnsupportedSpec"


@needs_no_driver
@pytest.mark.parametrize("version", ["1.27.0", "1.28.0"])
def test_lazy_release_refuses_an_unknown_keyword_at_validate_and_the_chain_goes_on(version):
    # 1.27-1.30 take any keyword at sdpa() and refuse it when validate() lowers
    # the graph to C++: the chain must wrap the build, not the call.
    calls = _result(version, "causal", future=True)["calls"]
    assert calls[0]["kwargs"]["future_keyword"] == 1
    assert calls[0]["sdpa"] == "ok" and calls[0]["validate"].startswith(REFUSED)
    assert "future_keyword" not in calls[1]["kwargs"] and NO_DRIVER in calls[1]["validate"]


def test_eager_release_refuses_an_unknown_keyword_at_the_call():
    calls = _result("1.24.0", "causal", future=True)["calls"]
    assert calls[0]["sdpa"].startswith(REFUSED) and "validate" not in calls[0]
    assert calls[1]["sdpa"] == "ok" and "future_keyword" not in calls[1]["kwargs"]


@needs_no_driver
def test_1_31_validate_does_not_lower_so_an_unknown_keyword_passes_it():
    # 1.31 validates SDPA in Python (cudnn/_sdpa_validate.py) and lowers only
    # at create_execution_plans(): a CPU build cannot see the refusal.
    result = _result("1.31.0", "causal", future=True)
    assert result["outcome"] == "built" and result["dialect"] == "future"


@needs_no_driver
def test_1_31_lowers_as_far_as_build_operation_graph_on_cpu():
    result = _result("1.31.0", "causal", lower=True)
    # build_operation_graph() passes; planning needs the driver, and 1.31 reports
    # the backend's failure to load it as cudnnGraphNotSupportedError.
    call = result["calls"][-1]
    assert call["validate"] == "ok" and call["build_operation_graph"] == "ok"
    assert call["create_execution_plans"].startswith("cudnnGraphNotSupportedError: ")
    assert "NVIDIA driver" in call["create_execution_plans"]
    assert result["outcome"] == "error" and result["cause_type"] == "cudnnGraphNotSupportedError"
    assert "at create_execution_plans" in result["error"]
