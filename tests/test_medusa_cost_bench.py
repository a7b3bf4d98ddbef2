"""bench/medusa_cost_bench.py without the benchmark's passes: the account's rule on made-up runs, and one short run
of the deployed Medusa repository's model as its Triton adapter builds it, in-process."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.bench_scripts import bench_module


@pytest.fixture(scope="module")
def mc() -> ModuleType:
    return bench_module("medusa_cost_bench")


def runs(mc: ModuleType, *, plain_s: float, medusa_s: float, medusa_forward_s: float,
         medusa_tokens: list[int] | None = None) -> dict[str, list]:
    """Two requests of 8 tokens: plain in 8 steps of 1 ms forwards, Medusa in 3 steps of `medusa_forward_s`."""
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    plain = [mc.RequestRun(tokens, plain_s, 8, 0.008, 0.0) for _ in range(2)]
    medusa = [mc.RequestRun(medusa_tokens or tokens, medusa_s, 3, 3 * medusa_forward_s, 0.001) for _ in range(2)]
    return {"plain": plain, "medusa": medusa}


def test_the_account_holds_when_the_width_not_the_heads_keeps_medusa_below_the_floor(mc: ModuleType) -> None:
    # plain 10 ms a request; Medusa 8 ms (1.25x), of which 3 steps x (2 ms - 1 ms) is the tree's width: 5 ms (2.0x)
    acc = mc.account(runs(mc, plain_s=0.010, medusa_s=0.008, medusa_forward_s=0.002), floor=1.3)
    assert acc["x_plain"] == pytest.approx({"medusa": 1.25, "width free": 2.0})
    assert acc["width_ms_per_step"] == pytest.approx(1.0) and acc["holds"]
    assert acc["per_step"]["medusa"]["tokens_per_step"] == pytest.approx(16 / 6)
    assert "1.25x plain, 2.00x with the tree's forward" in acc["summary"]
    # Medusa reaching the floor: nothing to account for
    assert not mc.account(runs(mc, plain_s=0.010, medusa_s=0.007, medusa_forward_s=0.002), floor=1.3)["holds"]
    # the width is not what keeps it below: free width still under the floor
    assert not mc.account(runs(mc, plain_s=0.010, medusa_s=0.009, medusa_forward_s=0.0012), floor=1.3)["holds"]
    # other tokens than plain's: no account at all
    other = mc.account(runs(mc, plain_s=0.010, medusa_s=0.008, medusa_forward_s=0.002,
                            medusa_tokens=[1, 2, 3, 4, 5, 6, 7, 9]), floor=1.3)
    assert not other["holds"] and other["same_tokens"] == {"requests": 2, "same": 0}
    (same, fits, claim) = mc.judged({"account": other})
    assert same.met is False and fits.met is True and claim.met is None


def test_the_deployed_medusa_model_is_timed_in_its_own_steps(mc: ModuleType, deployed) -> None:
    """The repository's tensorrt_llm model decodes the same tokens plainly and with its tree; the clock sees every
    forward of both engines and the heads only in Medusa's, inside the steps' wall time."""
    import torch

    threads = torch.get_num_threads()  # the session's (tests/conftest.py): 1, as the repository's torch_threads
    torch.set_num_threads(threads + 1)
    try:
        model = mc.MedusaModel(deployed.repository("medusa"))
        assert torch.get_num_threads() == threads + 1  # main() sets the repository's threads; the model leaves them
    finally:
        torch.set_num_threads(threads)
    assert model.tree_nodes == len(model.choices)  # no schedule: the whole tree at one request
    prompt = model.prompt("The history of the printing press")
    got = {name: model.request(name, prompt, 24) for name in mc.ENGINES}
    plain, medusa = got["plain"], got["medusa"]
    assert plain.tokens == medusa.tokens and len(plain.tokens) <= 24
    assert plain.steps == len(plain.tokens) and medusa.steps <= plain.steps  # a step makes at least 1 token
    assert plain.heads_s == 0 and medusa.heads_s > 0
    for run in (plain, medusa):
        assert 0 < run.forward_s + run.heads_s < run.total_s
    report = {"account": mc.account({name: [run] for name, run in got.items()})}
    assert [t.met for t in mc.judged(report)] == [True, True, None]
