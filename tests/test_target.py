from __future__ import annotations

import pytest

from graphcache import NoGpu, Target, TargetError
from graphcache.target import cudnn_version_text, normalise_gpu_name


def test_text_form_round_trips():
    text = "h200-sm90-cudnn9.28.0-fe1.32.0"
    target = Target.parse(text)
    assert target == Target("h200", "9.0", "9.28.0", "1.32.0")
    assert str(target) == text


@pytest.mark.parametrize(
    "text, cc",
    [
        ("a100_sxm4_80gb-sm80-cudnn9.1.0-fe1.8.0", "8.0"),
        ("b200-sm100-cudnn9.10.2-fe1.28.0", "10.0"),
        ("rtx_4090-sm89-cudnn9.5.1-fe1.12.0", "8.9"),
    ],
)
def test_compute_capability_from_sm(text, cc):
    target = Target.parse(text)
    assert target.compute_capability == cc
    assert str(target) == text


@pytest.mark.parametrize(
    "text",
    [
        "",
        "h200",
        "H200-sm90-cudnn9.28.0-fe1.32.0",
        "h200-90-cudnn9.28.0-fe1.32.0",
        "h200-sm90-cudnn9-fe1.32.0",
        "h200-sm90-cudnn9.28.0",
        "h200-sm90-cudnn9.28.0-fe1.32.0-x",
    ],
)
def test_malformed_text_shows_the_expected_form(text):
    with pytest.raises(TargetError, match="expected GPU-smMAJORMINOR"):
        Target.parse(text)


def test_gpu_names_are_normalised():
    assert normalise_gpu_name("NVIDIA H200") == "h200"
    assert normalise_gpu_name("NVIDIA A100-SXM4-80GB") == "a100_sxm4_80gb"
    assert normalise_gpu_name("NVIDIA GeForce RTX 4090") == "rtx_4090"
    assert normalise_gpu_name("Tesla T4") == "t4"


def test_cudnn_integer_versions():
    assert cudnn_version_text(92800) == "9.28.0"
    assert cudnn_version_text(91002) == "9.10.2"
    assert cudnn_version_text(8902) == "8.9.2"


@pytest.mark.torch
def test_detect_without_gpu_raises_no_gpu_with_a_clear_message():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(NoGpu, match="no CUDA GPU found") as refused:
        Target.detect()
    assert "--compiler reference" in str(refused.value), "the fix a machine without a GPU has"


@pytest.mark.parametrize(
    "text",
    [
        "h200-sm90-mp132-cudnn9.28.0-fe1.32.0",
        "h200-sm90-cudnn9.28.0-fe1.32.0",
        "a100_sxm4_80gb-sm80-cudnn9.1-fe1.7.0",
        "H200-sm90-cudnn9.28.0-fe1.32.0",
        "h200-sm9-cudnn9.28.0-fe1.32.0",
        "h200-sm90-mp-cudnn9.28.0-fe1.32.0",
        "h200-sm90-cudnn9-fe1.32.0",
        "h200-sm90-cudnn9.28.0.1.2-fe1.32.0",
        "h200-sm90-cudnn9.28.0-fe1.32.0-extra",
        "h200-sm٩0-cudnn9.28.0-fe1.32.0",  # a non-ASCII digit
    ],
)
def test_the_plain_pattern_accepts_exactly_what_parse_accepts(text):
    """target.PATTERN (for OpenAPI validators) is written out by hand beside
    the parser's regex: they must not drift apart."""
    import re

    from graphcache.target import PATTERN

    try:
        Target.parse(text)
        parsed = True
    except TargetError:
        parsed = False
    assert (re.fullmatch(PATTERN, text, re.ASCII) is not None) == parsed
