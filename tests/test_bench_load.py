"""The order of interleaved served runs (specbuild.bench.load.rotations): no deployment or K always runs first."""

from __future__ import annotations

from specbuild.bench.load import rotations


def test_every_pass_runs_every_item_once_and_no_item_is_always_first() -> None:
    names = [f"d{i}" for i in range(11)]
    passes = rotations(names, 3)
    assert [sorted(p) for p in passes] == [sorted(names)] * 3
    assert passes[0] == names  # the first pass is the listed order
    assert len({p[0] for p in passes}) == 3 and len({p[-1] for p in passes}) == 3


def test_as_many_passes_as_items_put_each_item_in_each_position_once() -> None:
    ks = list(range(1, 9))
    passes = rotations(ks, len(ks))
    for position in range(len(ks)):
        assert sorted(p[position] for p in passes) == ks


def test_more_passes_than_items_and_no_items() -> None:
    passes = rotations([1, 2], 4)
    assert [p[0] for p in passes] == [1, 1, 2, 2]
    assert rotations([], 2) == [[], []]
