"""The release table (graphcache/compilers/cudnn/releases.py): what each
cudnn-frontend / cuDNN / compute capability can do, walked for frontends 1.3
to 1.32 and the cuDNN releases the notes name.

The boundaries asserted here are the figures of /work/shared/CUDNN_NOTES.md,
notes/shape-classes.md §2 and notes/ragged-paged.md; the frontend-only rows
are also checked against the real old bindings in tests/test_frontend_versions.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from graphcache.compilers.cudnn import releases as r
from graphcache.errors import TargetError

FRONTENDS = [f"1.{minor}.0" for minor in range(3, 33)]
CUDNNS = [
    *("9.0.0", "9.5.0", "9.7.0", "9.10.0", "9.10.2", "9.18.0", "9.18.1"),
    *("9.20.0", "9.21.0", "9.22.0", "9.23.0", "9.24.0", "9.25.0", "9.28.0"),
]
CCS = ["8.0", "8.6", "8.9", "9.0", "10.0"]
SM8X = ["8.0", "8.6", "8.9"]
REPO = Path(__file__).resolve().parents[1]


def first_frontend(name: str, cudnn: str = "9.28.0", cc: str = "9.0") -> str | None:
    return next((fe for fe in FRONTENDS if r.available(name, fe, cudnn, cc)), None)


def first_cudnn(name: str, cc: str, frontend: str = "1.32.0") -> str | None:
    return next((cu for cu in CUDNNS if r.available(name, frontend, cu, cc)), None)


@pytest.mark.parametrize(
    ("name", "first"),
    [
        (r.BEHAVIOR_NOTE_FILTER, "1.3.0"),
        (r.BOTTOM_RIGHT_FLAGS, "1.5.0"),
        (r.PAGED, "1.8.0"),
        (r.DIAGONAL_BAND, "1.10.0"),
        (r.RAGGED_OVER_PAGED, "1.11.0"),
        (r.PACKED_PAGE_TABLES, "1.12.0"),
        (r.GENERATE_STATS, "1.13.0"),
        (r.DESERIALIZE_HANDLE, "1.14.0"),
        (r.UID_KEYWORD, "1.14.0"),
        (r.OVERRIDE_FLAG, "1.20.0"),
        (r.SHAPE_OVERRIDE, "1.24.0"),
        (r.OVERRIDE_WORKSPACE, "1.24.0"),
        (r.TOKEN_OFFSETS, "1.25.0"),
        (r.CU_SEQ_LEN, "1.25.0"),
        (r.ENFORCE_PRECOMPILED, "1.26.0"),
        (r.LAZY_KEYWORDS, "1.27.0"),
        (r.CU_SEQ_LEN_MIXED, "1.27.0"),
        (r.PYTHON_ENGINES, "1.31.0"),
        (r.BYTES_PAYLOAD, "1.32.0"),
        (r.PYTHON_ENGINE_BLOBS, "1.32.0"),
    ],
)
def test_first_frontend_of_each_feature(name, first):
    assert first_frontend(name) == first


@pytest.mark.parametrize(
    ("name", "cc", "first"),
    [
        (r.SERIALIZED_PLANS, "9.0", "9.0.0"),
        (r.PAGED, "9.0", "9.5.0"),
        (r.RAGGED_OVER_PAGED, "9.0", "9.7.0"),
        (r.PACKED_PAGE_TABLES, "9.0", "9.10.2"),
        (r.OVERRIDE_FLAG, "9.0", "9.21.0"),
        (r.SHAPE_OVERRIDE, "9.0", "9.21.0"),
        (r.OVERRIDE_WORKSPACE, "9.0", "9.23.0"),
        (r.TOKEN_OFFSETS, "9.0", "9.24.0"),
        (r.CU_SEQ_LEN, "9.0", "9.24.0"),
        (r.CU_SEQ_LEN_MIXED, "9.0", "9.25.0"),
        # Ragged on SM80/SM89 needs 9.18.1; SM90+ have no such gate (ragged-paged.md Q1).
        (r.RAGGED, "9.0", "9.0.0"),
        (r.RAGGED, "10.0", "9.0.0"),
        *[(r.RAGGED, cc, "9.18.1") for cc in SM8X],
        *[(r.RAGGED_OVER_PAGED, cc, "9.18.1") for cc in SM8X],
        *[(r.TOKEN_OFFSETS, cc, "9.24.0") for cc in SM8X],
    ],
)
def test_first_cudnn_of_each_feature(name, cc, first):
    assert first_cudnn(name, cc) == first


def test_shape_override_needs_both_a_forwarding_frontend_and_cudnn_9_21():
    for cc in CCS:
        assert not r.available(r.SHAPE_OVERRIDE, "1.23.0", "9.28.0", cc)  # 1.18-1.23 drop the lists
        assert not r.available(r.SHAPE_OVERRIDE, "1.24.0", "9.20.0", cc)
        assert r.available(r.SHAPE_OVERRIDE, "1.24.0", "9.21.0", cc)
        # The flag alone exists from 1.20, which is exactly the trap.
        assert r.available(r.OVERRIDE_FLAG, "1.23.0", "9.21.0", cc)
        assert not r.available(r.OVERRIDE_WORKSPACE, "1.24.0", "9.22.0", cc)
        assert r.available(r.OVERRIDE_WORKSPACE, "1.24.0", "9.23.0", cc)


def test_ragged_on_sm89_starts_at_9_18_1_and_on_sm90_follows_the_plain_floor():
    assert not r.available(r.RAGGED, "1.32.0", "9.18.0", "8.9")
    assert r.available(r.RAGGED, "1.32.0", "9.18.1", "8.9")
    assert r.available(r.RAGGED, "1.32.0", "9.18.0", "9.0")
    assert r.available(r.RAGGED, "1.32.0", 91800, (9, 0))


def test_compute_capability_below_8_has_no_fused_attention():
    assert not r.available(r.FUSED_ATTENTION, cc="7.5")
    assert r.available(r.FUSED_ATTENTION, cc="8.0")
    assert not r.available(r.PAGED, "1.32.0", "9.28.0", "7.5")


def test_the_walk_is_monotone_and_features_agrees_with_available():
    """Newer never loses a feature, on every compute capability walked."""
    for cc in CCS:
        previous: frozenset[str] | None = None
        for fe in FRONTENDS:
            row = frozenset()
            for cu in CUDNNS:
                have = r.features(fe, cu, cc)
                assert have == {n for n in r.FEATURES if r.available(n, fe, cu, cc)}
                assert row <= have, (fe, cu, cc)
                row = have
            if previous is not None:
                assert previous <= row, (fe, cc)
            previous = row


def test_missing_names_what_is_needed_and_what_the_target_has():
    assert r.missing(r.SHAPE_OVERRIDE, "1.32.0", "9.19.0", "9.0") == (
        "execute-time shape override needs cuDNN >= 9.21 and cudnn-frontend >= 1.24; "
        "this target has cuDNN 9.19.0, cudnn-frontend 1.32.0"
    )
    assert r.missing(r.SHAPE_OVERRIDE, "1.32.0", "9.21.0", "9.0") is None
    text = r.missing(r.RAGGED, "1.32.0", 91800, "8.9")
    assert text is not None and "cuDNN >= 9.18.1" in text and "compute capability 8.9" in text
    assert "(>= 9.18.1 below compute capability 9.0)" in r.requirement(r.RAGGED)
    assert r.requirement(r.RAGGED, "9.0") == "cuDNN >= 8.9 and cudnn-frontend >= 1.1 and compute capability >= 8.0"


def test_an_unknown_version_is_not_enough():
    assert not r.available(r.SHAPE_OVERRIDE, "1.32.0", None, "9.0")
    assert "cuDNN unknown" in (r.missing(r.SHAPE_OVERRIDE, "1.32.0", None, "9.0") or "")
    assert not r.available(r.RAGGED, "1.32.0", "9.28.0")  # cc unknown: the SM8x floor applies
    assert r.available(r.BYTES_PAYLOAD, "1.32.0")  # a frontend-only feature needs no cuDNN


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("1.32.0", (1, 32, 0)),
        ("1.32.0+cu12", (1, 32, 0)),
        ("1.32.0rc1", (1, 32, 0)),
        ("1.24", (1, 24, 0)),
        ("9.18.1", (9, 18, 1)),
        (92800, (9, 28, 0)),
        ("91801", (9, 18, 1)),
        (8902, (8, 9, 2)),
        ((1, 24), (1, 24, 0)),
    ],
)
def test_versions_parse_in_every_form_the_code_has(text, parsed):
    assert r.parse_version(text) == parsed


@pytest.mark.parametrize("bad", ["unknown", "", "v", (), (1, -2)])
def test_a_version_that_does_not_parse_is_a_clear_error(bad):
    with pytest.raises(TargetError, match="is not a version"):
        r.parse_version(bad)


def test_an_unknown_feature_or_capability_is_a_clear_error():
    with pytest.raises(KeyError, match="no feature 'paged_attention'.*known: .*paged"):
        r.available("paged_attention", "1.32.0", "9.28.0", "9.0")
    with pytest.raises(TargetError, match="compute capability 'sm_nine'"):
        r.available(r.PAGED, "1.32.0", "9.28.0", "sm_nine")


def test_every_row_cites_its_source_and_every_name_is_a_row():
    constants = {v for k, v in vars(r).items() if k.isupper() and isinstance(v, str)}
    assert constants == set(r.FEATURES)
    for row in r.FEATURES.values():
        assert row.source and (row.frontend or row.cudnn or row.min_cc), row.name
        for floor in (row.frontend, row.cudnn):
            if floor:
                r.parse_version(floor)


def test_the_dialect_labels_come_from_the_table():
    from graphcache.compilers.cudnn import DIALECTS

    assert [(d.name, d.frontends, d.requires) for d in DIALECTS] == [
        ("diagonal_band", "1.13+", ("diagonal_alignment",)),
        ("diagonal_band_is_inference", "1.10-1.12", ("diagonal_alignment",)),
        ("causal_flags", "1.5-1.9", ()),
    ]


# A comparison with a version-shaped literal: (1, 32), 90000, "1.26".
VERSION_COMPARE = re.compile(r"[<>]=?\s*(\(\s*\d+\s*,\s*\d+|\d{5}\b|[\"']\d+\.\d+)|_version_tuple")


def test_no_module_of_the_compilers_compares_versions_but_the_table():
    offenders = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in sorted((REPO / "graphcache" / "compilers").rglob("*.py"))
        if path.name != "releases.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if VERSION_COMPARE.search(line.split("#")[0])
    ]
    assert offenders == []
