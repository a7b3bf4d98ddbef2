"""The order of interleaved served runs (specbuild.bench.load.rotations): no deployment or K always runs first; and
what a run's summary says of how finely an answer streamed."""

from __future__ import annotations

import math

import pytest

from specbuild.bench.client import Generation
from specbuild.bench.load import Load, TokenCounter, rotations, summarise


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


def test_the_summary_says_how_coarsely_each_answer_streamed() -> None:
    """Tokens per response and each request's longest wait between responses: a stream of 8-token chunks and one
    of single tokens make the same tokens/s and ITL, and only these two figures tell them apart."""
    fine = Generation(text=" ".join(["w"] * 8), response_times=[0.1 + 0.01 * i for i in range(8)], latency_s=0.17)
    coarse = Generation(text=" ".join(["w"] * 8), response_times=[0.1, 0.13, 0.17], latency_s=0.17)
    whole = Generation(text=" ".join(["w"] * 8), response_times=[0.17], latency_s=0.17)
    summary = summarise("u", "m", "grpc", Load(), [(fine, None), (coarse, None), (whole, None)], 1.0,
                        TokenCounter())
    assert summary.tokens_per_response == pytest.approx(24 / 12)
    assert summary.longest_gap_ms["p50"] == pytest.approx(25.0)  # 10 ms (fine) and 40 ms (coarse): one answer
    alone = summarise("u", "m", "grpc", Load(), [(whole, None)], 1.0, TokenCounter())
    assert alone.tokens_per_response == 8 and math.isnan(alone.longest_gap_ms["p50"])  # no second response


def test_acceptance_an_answer_does_not_carry_is_not_reported_rather_than_zero() -> None:
    """An OpenAI server other than specbuild's Dynamo workers may answer without acceptance figures: the summary and
    the table say "not reported", where a server that reported zero drafts shows none."""
    from rich.console import Console

    from specbuild.bench.report import table

    silent = Generation(text="a b", response_times=[0.1, 0.2], latency_s=0.2)
    none_drafted = Generation(text="a b", response_times=[0.1, 0.2], latency_s=0.2, acceptance_rate=0.0,
                              accepted_draft_tokens=0, draft_tokens=0)
    quiet = summarise("u", "m", "openai", Load(), [(silent, None)], 1.0, TokenCounter())
    plain = summarise("u", "m", "grpc", Load(), [(none_drafted, None)], 1.0, TokenCounter())
    assert (quiet.acceptance_reported, quiet.acceptance_rate) == (False, None)
    assert (plain.acceptance_reported, plain.acceptance_rate) == (True, None)
    console = Console(width=200, record=True)
    console.print(table({"quiet": quiet, "plain": plain}))
    rows = {line.split("│")[1].strip(): line for line in console.export_text().splitlines() if line.count("│") > 2}
    assert rows["acceptance rate"].count("not reported") == 1
    assert rows["accepted / draft tokens"].count("not reported") == 1
