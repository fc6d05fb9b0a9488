"""graphcache.models.shadows: meta tensors that keep the values of the small
ones, so host reads in mask code answer as they would on a real device."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the tracer needs torch (pip install '.[hf]')")

from graphcache.models.shadows import LIMIT, Shadows, UnknownValue, shadow  # noqa: E402

META = "meta"


def test_a_padding_masks_host_reads_answer_as_on_a_cpu():
    with Shadows():
        mask = torch.ones((2, 6), dtype=torch.long, device=META)
        mask[0, :3] = 0
        pad = mask.to(torch.bool)
        assert pad.device.type == META
        assert not bool(pad.all()) and bool(pad[1].all())
        assert pad.sum(dim=1).tolist() == [3, 6]
        assert (pad[:, 1:] & ~pad[:, :-1]).any().item() is True  # a token after padding: left padding
        assert int(torch.arange(5, device=META).sum()) == 10


def test_a_view_written_in_place_keeps_its_base_consistent():
    with Shadows():
        base = torch.zeros((3, 4), dtype=torch.long, device=META)
        base[1].fill_(7)
        base[:, 0] += 1
        assert base.tolist() == [[1, 0, 0, 0], [8, 7, 7, 7], [1, 0, 0, 0]]


def test_an_op_whose_size_comes_from_values_gets_it_from_the_known_values():
    with Shadows():
        mask = torch.tensor([[0, 1, 1], [1, 1, 0]], device=META)
        rows = mask.nonzero()
        assert rows.device.type == META and rows.shape == (4, 2)
        assert rows.tolist() == [[0, 1], [0, 2], [1, 0], [1, 1]]


def test_large_tensors_stay_shapes_and_a_read_of_one_is_named():
    with Shadows():
        hidden = torch.zeros((64, LIMIT // 32), device=META)  # activations: above the limit, no value kept
        assert shadow(hidden) is None
        score = hidden.sum()  # computed from an unknown value: unknown too
        assert shadow(score) is None
        with pytest.raises(UnknownValue, match=r"_local_scalar_dense.*shape \(\)"):
            bool(score > 0)
        small = torch.ones(4, device=META)
        small.copy_(hidden[0, :4])  # written from an unknown value: no longer known
        with pytest.raises(UnknownValue):
            small.tolist()


def test_outside_the_mode_meta_tensors_are_plain_meta():
    mask = torch.ones((2, 3), device=META)
    assert shadow(mask) is None
    with pytest.raises((RuntimeError, NotImplementedError)):
        mask.tolist()
