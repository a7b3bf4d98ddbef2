"""The serving engine: in-flight (continuous) batching of many sequences over one model.

What TensorRT-LLM's executor does for its engines, done for the reference runtime: every sequence has its own
row of one KV cache; requests that arrive while others run join the batch at the next step, finished ones leave
it, and each step runs the active sequences' next blocks in one batched forward - a plain decode token, a prompt
(prefill), a prompt tail plus external draft tokens to verify (draft-target), or a Medusa candidate tree - padded
to one length, each row with its own positions and attention mask. With a `Proposer`
(`specbuild.runtime.proposers`: NGram, a draft model, the self-draft, EAGLE-3) the engine drafts for its sequences
itself: a decoding sequence's block becomes [last token, its drafts] (or the drafted token tree), verified in the
same batched forward as external draft tokens and by the same rules; the proposer knows nothing of verification,
the verification nothing of how the drafts were made. A finished sequence's row stays in a pool
until the row is needed, so a request that repeats its prefix (the BLS sends the whole sequence every round)
computes only its new tokens, as TensorRT-LLM's KV-cache block reuse does.

The engine knows nothing of Triton: requests are plain dataclasses, results come back through a callback per
update (from the engine's thread) or by waiting on the handle. Stop rules are the runtime's (`SequenceState`),
the acceptance rules the runtime's (`accept_greedy`, `accept_rejection_sampling`, the Medusa tree's).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from specbuild.medusa.tree import MedusaTree, accept_typical
from specbuild.runtime.acceptance import AcceptRule, accept_greedy, accept_rejection_sampling
from specbuild.runtime.decoding import SamplingDecoding, TokenDecoding
from specbuild.runtime.kv_cache import KVCache
from specbuild.runtime.lookahead import (
    LookaheadConfig,
    LookaheadState,
    StepPlan,
    ancestors,
    depths,
    max_block_tokens,
    request_problem,
    tree_mask,
)
from specbuild.runtime.lookahead import check_config as check_lookahead
from specbuild.runtime.model import CausalLM, ForwardOutput
from specbuild.runtime.proposers import Proposal, Proposer
from specbuild.runtime.sampling import SamplingParams
from specbuild.runtime.schedule import DraftSchedule
from specbuild.runtime.sequence import GenerationStats, SequenceState, StopCriteria

_log = logging.getLogger(__name__)

FinishReason = Literal["length", "end_id", "stop_word", "cancelled", "error", "round"]
"""Why a sequence ended: max_new_tokens, its end id, a stop word, cancelled, failed, or (a `one_round` request
with external draft tokens) its verification round done."""


@dataclass
class EngineRequest:
    """One sequence to serve. With `draft_tokens` its first step verifies them (the target's side of draft-target
    decoding: the longest accepted prefix of the drafts plus one token of the model's own), then it decodes on to
    max_new_tokens as TensorRT-LLM's external draft tokens do, or stops after that round (`one_round`)."""

    prompt: list[int]
    max_new_tokens: int
    params: SamplingParams = field(default_factory=SamplingParams)
    end_id: int | None = None
    stop_words: tuple[tuple[int, ...], ...] = ()
    include_stop_words: bool = False  # True: TensorRT-LLM's executor semantics (the stop word is output)
    bad_words: tuple[tuple[int, ...], ...] = ()
    min_tokens: int = 0
    decoding: TokenDecoding | None = None  # default: SamplingDecoding(params, bad_words, min_tokens, end_id)
    draft_tokens: list[int] | None = None
    draft_logits: torch.Tensor | None = None  # [len(draft_tokens), V]: accept by rejection sampling
    one_round: bool = False
    speculate: bool = True  # Medusa engines: use the tree when this request allows it
    typical: Typical | None = None  # Medusa: the paper's typical acceptance instead of matching the model's choice
    lookahead: LookaheadConfig | None = None  # Lookahead engines: this request's (w, n, g), within the engine's
    return_logits: bool = False  # each emitted token's raw logits (generation_logits)
    return_log_probs: bool = False
    return_context_logits: bool = False  # the prompt's raw logits (computes the whole prompt: no prefix reuse)
    cancelled: Callable[[], bool] | None = None  # asked between steps: True ends the sequence
    on_update: Callable[[Update], None] | None = None

    def token_decoding(self) -> TokenDecoding:
        return self.decoding or SamplingDecoding(self.params, self.bad_words, self.min_tokens, self.end_id)


@dataclass(frozen=True)
class Typical:
    """Medusa's typical acceptance (Cai et al. 2024): accept a node whose token the model gives probability above
    min(threshold, alpha * exp(-entropy)); needs a temperature > 0."""

    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3


@dataclass
class Update:
    """What one engine step did for one sequence."""

    tokens: list[int]  # tokens emitted this step (end id and dropped stop words not included)
    finished: bool = False
    reason: FinishReason | None = None
    logits: torch.Tensor | None = None  # [len(tokens), V] raw logits when return_logits
    log_probs: list[float] = field(default_factory=list)
    cum_log_prob: float = 0.0  # unnormalised log probabilities of every emitted token so far
    context_logits: torch.Tensor | None = None  # [prompt, V] on the first update, when asked for
    accepted_draft_tokens: int = 0  # totals so far
    draft_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose KV came from the cache
    error: str | None = None


@dataclass
class Result:
    """Everything a finished sequence produced."""

    tokens: list[int]
    reason: FinishReason | None
    accepted_draft_tokens: int = 0
    draft_tokens: int = 0
    logits: torch.Tensor | None = None
    log_probs: list[float] = field(default_factory=list)
    cum_log_prob: float = 0.0
    context_logits: torch.Tensor | None = None
    error: str | None = None
    first_token_time: float | None = None
    finish_time: float | None = None


class Handle:
    """A submitted request: wait for its result, or cancel it."""

    def __init__(self, request: EngineRequest) -> None:
        self.request = request
        self.arrival_time = time.time()
        self.first_scheduled_time: float | None = None
        self.cancelled = False
        self._done = threading.Event()
        self._tokens: list[int] = []
        self._logits: list[torch.Tensor] = []
        self._log_probs: list[float] = []
        self.result: Result | None = None
        self.reused_tokens = 0  # prompt tokens whose KV came from the cache
        self.first_token_time: float | None = None
        self._context: torch.Tensor | None = None
        self.callback_error: str | None = None  # on_update raised: the engine ends the request with this error

    def cancel(self) -> None:
        self.cancelled = True

    def wait(self, timeout: float | None = None) -> Result:
        if not self._done.wait(timeout):
            raise TimeoutError("the request did not finish in time")
        assert self.result is not None
        return self.result

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def _record(self, update: Update) -> None:
        now = time.time()
        if self.first_token_time is None and update.tokens:
            self.first_token_time = now
        self._tokens += update.tokens
        if update.logits is not None:
            self._logits.append(update.logits)
        self._log_probs += update.log_probs
        if update.context_logits is not None:
            self._context = update.context_logits
        if update.finished:
            logits = torch.cat(self._logits) if self._logits else None
            self.result = Result(self._tokens, update.reason, update.accepted_draft_tokens, update.draft_tokens,
                                 logits, self._log_probs, update.cum_log_prob, self._context, update.error,
                                 self.first_token_time, now)
        if self.request.on_update is not None:
            try:
                self.request.on_update(update)
            except Exception as err:
                # The caller's callback runs on the engine's thread: its failure ends this request (with an error
                # update at the next step, see ServingEngine._drop_cancelled), never the engine and the others. A
                # failure on the last update has no request left to end: it is only logged.
                _log.warning("a request's update callback failed%s", "" if update.finished else "; the request ends",
                             exc_info=True)
                if self.callback_error is None and not update.finished:
                    self.callback_error = f"the request's update callback failed: {type(err).__name__}: {err}"
                    self.cancelled = True
        if update.finished:
            self._done.set()


# -- one sequence -----------------------------------------------------------------------------------------------


@dataclass
class _Block:
    """A row's input for one forward: tokens, their positions, and (tree rows) the Medusa tree."""

    tokens: list[int]
    positions: list[int]
    tree: MedusaTree | None = None  # None: a causal block
    lookahead: StepPlan | None = None  # Lookahead rows: the step's window and candidates (a tree of its own)
    mask: torch.Tensor | None = None  # [T, T] bool for a Lookahead row (its tree's ancestors)
    drafts: list[int] | None = None  # draft tokens to verify: the block's last len(drafts) tokens
    draft_logits: torch.Tensor | None = None  # [len(drafts), V] the draft's raw logits (rejection sampling's q)
    external: bool = False  # the request's own draft tokens (TensorRT-LLM's external drafts), not a proposer's


class _Sequence:
    """A request being served: its progress, its KV row, and what it feeds next."""

    def __init__(self, handle: Handle, engine: ServingEngine) -> None:
        request = handle.request
        self.handle, self.request, self.engine = handle, request, engine
        self.decoding = request.token_decoding()
        self.state = SequenceState(list(request.prompt))
        self.stop = StopCriteria(request.max_new_tokens, request.end_id, request.stop_words,
                                 request.include_stop_words)
        self.row = -1
        self.committed: list[int] = []  # exactly the tokens whose K/V the row holds
        self.pending: list[int] = []  # tokens to feed next (the cache holds everything before them)
        self.gen = None if self.decoding.greedy else torch.Generator().manual_seed(_seed(request, self.decoding))
        self.accepted = self.drafted = 0
        self.iterations = 0  # target forwards that ran this sequence's blocks (the speculation gate's denominator)
        self.cum_log_prob = 0.0
        self.sent = 0  # output tokens already sent in updates
        self.token_logits: list[torch.Tensor] = []  # the raw logits each output token came from
        self.token_log_probs: list[float] = []
        self.context_logits: torch.Tensor | None = None
        self.topk: list[list[int]] | None = None  # Medusa: [heads][k] head guesses at the last accepted position
        self.heads_at: int | None = None  # block position whose hidden state the heads read after this step
        self.medusa = engine.tree is not None and request.speculate and request.draft_tokens is None
        self.verify = request.draft_tokens is not None
        self.drafting = engine.proposer is not None and request.speculate and not request.one_round
        self.proposal: Proposal | None = None  # this step's drafts from the engine's proposer
        self.draft_state: object = None  # the proposer's own per-sequence state
        # Lookahead (greedy requests only: its verification matches the model's argmax; others decode plainly).
        config = LookaheadConfig(*(request.lookahead or engine.lookahead or (1, 1, 0)))  # (1, 1, 0): plain
        self.lookahead = (LookaheadState(request.prompt, config) if config.ngram_size > 1 and request.speculate
                          and not self.verify and self.decoding.greedy else None)

    # -- what to feed ----------------------------------------------------------------------------------------
    def block(self, tree: MedusaTree | None) -> _Block:
        """This step's block; `tree` is the Medusa tree the engine's load allows now (None: no speculation)."""
        start = len(self.committed)
        if self.verify:
            drafts = list(self.request.draft_tokens or ())
            tokens = [*self.pending, *drafts]
            return _Block(tokens, list(range(start, start + len(tokens))), drafts=drafts,
                          draft_logits=self.request.draft_logits, external=True)
        proposal, self.proposal = self.proposal, None
        if proposal is not None and proposal.tree is not None:
            tree = proposal.tree
            return _Block([*self.pending, *proposal.tokens], (start + tree.depth).tolist(), tree)
        if proposal is not None:
            tokens = [*self.pending, *proposal.tokens]
            return _Block(tokens, list(range(start, start + len(tokens))), drafts=list(proposal.tokens),
                          draft_logits=proposal.logits)
        if self.medusa and tree is not None and self.topk is not None:
            # Guesses made at a higher load may be from fewer heads than this step's tree is deep.
            tree = self.engine.within_depth(tree, len(self.topk))
            nodes = tree.candidates(self.pending[-1], self.topk)
            return _Block(nodes, [start + depth for depth in tree.depths], tree)
        if self.lookahead is not None and self.engine.step_lookahead and len(self.pending) == 1:
            plan = self.lookahead.plan(self.pending[0])
            positions = [start + d for d in depths(plan.parents)]
            return _Block(plan.tokens, positions, lookahead=plan, mask=tree_mask(plan.parents))
        return _Block(list(self.pending), list(range(start, start + len(self.pending))))

    # -- what the forward said ---------------------------------------------------------------------------------
    def after(self, block: _Block, out: ForwardOutput, row: int) -> tuple[int, torch.Tensor | None, Update]:
        """Accept/sample from the row's logits; returns (tokens to commit as a linear prefix of the block, or
        the tree path to compact; the Update)."""
        logits = out.logits[row, : len(block.tokens)]
        self.iterations += 1
        if self.request.return_context_logits and self.context_logits is None:
            self.context_logits = logits[: len(self.request.prompt)].float().clone()
        if block.tree is not None:
            return self._after_tree(block, out, row, logits)
        if block.lookahead is not None:
            return self._after_lookahead(block.lookahead, logits)
        if block.drafts is not None:
            return self._after_verify(block, logits)
        return self._after_linear(block, out, row, logits)

    def _after_linear(self, block: _Block, out: ForwardOutput, row: int,
                      logits: torch.Tensor) -> tuple[int, None, Update]:
        raw = logits[-1:]
        processed = self.decoding.process(raw, self.state.tokens, len(self.state.output))
        token = self.decoding.choose(processed, self.gen)[0]
        # The heads' guesses for the next step, when the tree is on now (else they would go stale unread: the
        # first step after the load drops again is a plain one that makes them).
        self.topk = None
        self.heads_at = len(block.tokens) - 1 if self.medusa and self.engine.step_tree is not None else None
        update = self._emit([token], list(raw), list(processed))
        self.committed += block.tokens
        return len(block.tokens), None, update

    def _after_verify(self, block: _Block, logits: torch.Tensor) -> tuple[int, None, Update]:
        """The one verification of draft tokens, the request's own or a proposer's: greedy, the longest prefix
        matching the target's choices; sampling, modified rejection sampling against the draft's distributions
        (one-hot where the drafts came without logits: token drafts such as n-grams)."""
        drafts = list(block.drafts or ())
        k, tail = len(drafts), len(block.tokens) - len(drafts)
        raw = logits[tail - 1 :]  # [k + 1, V]: after the last prompt token, then after each draft
        processed = self.decoding.process(raw, self.state.tokens, len(self.state.output),
                                          [drafts[:i] for i in range(k + 1)])
        draft_tensor = torch.tensor(drafts, dtype=torch.long)
        if self.decoding.greedy:
            accepted, nxt = accept_greedy(processed, processed, draft_tensor, None)  # type: ignore[arg-type]
        else:
            q = (self.decoding.draft_probabilities(block.draft_logits) if block.draft_logits is not None
                 else torch.nn.functional.one_hot(draft_tensor, processed.shape[-1]).float())
            assert self.gen is not None
            accepted, nxt = self.engine.accept(self.decoding.probabilities(processed), q, draft_tensor, self.gen)
        self.accepted += accepted
        self.drafted += k
        if k:
            self.engine.stats.acceptance.record_acceptance(k, accepted)
        if block.external:
            self.verify = False  # the request's drafts were for this step only
        update = self._emit([*drafts[:accepted], nxt], list(raw[: accepted + 1]), list(processed[: accepted + 1]),
                            one_round=block.external and self.request.one_round)
        commit = tail + accepted
        self.committed += block.tokens[:commit]
        return commit, None, update

    def _after_tree(self, block: _Block, out: ForwardOutput, row: int,
                    logits: torch.Tensor) -> tuple[int, torch.Tensor, Update]:
        tree = block.tree
        assert tree is not None
        tokens = block.tokens
        decoding = self.decoding.for_tree()
        ahead = [[tokens[node] for node in path] for path in tree.ancestors]
        processed = decoding.process(logits, self.state.tokens, len(self.state.output), ahead)
        typical = self.request.typical
        if typical is not None:
            kept, accepted = accept_typical(tree, torch.tensor(tokens), processed, self.request.params.temperature,
                                            typical.posterior_threshold, typical.posterior_alpha)
            nodes = kept.tolist()
            choice = decoding.choose(processed, self.gen)
        else:
            # The model's own choice at every node (argmax, or a draw); a path is accepted while each node's
            # token is the choice at its parent.
            choice = decoding.choose(processed, self.gen)
            nodes, accepted = tree.longest_matching(tokens, choice)
        last = nodes[-1]
        self.accepted += accepted
        self.drafted += tree.max_depth
        self.engine.stats.acceptance.record_acceptance(tree.max_depth, accepted)
        self.heads_at = last if self.medusa else None
        path = torch.tensor(nodes, dtype=torch.long)
        emitted = [*(tokens[node] for node in nodes[1:]), choice[last]]
        update = self._emit(emitted, list(logits[path]), list(processed[path]), decoding)
        self.committed += [tokens[node] for node in nodes]
        return 0, path, update

    def _after_lookahead(self, plan: StepPlan, logits: torch.Tensor) -> tuple[int, torch.Tensor, Update]:
        """Lookahead (greedy): the model's choice after every block token (each sees its own ancestors, so
        penalties and bans apply as in plain decoding); the accepted path's K/V is compacted like a Medusa path."""
        assert self.lookahead is not None
        decoding = self.decoding.for_tree()
        ahead = [[plan.tokens[i] for i in ancestors(plan.parents, node)] for node in range(len(plan.tokens))]
        processed = decoding.process(logits, self.state.tokens, len(self.state.output), ahead)
        choice = decoding.choose(processed, None)
        path, emitted = self.lookahead.after(plan, choice, self.state.tokens)
        accepted, proposed = len(path) - 1, self.lookahead.config.ngram_size - 1
        self.accepted += accepted
        self.drafted += proposed
        self.engine.stats.acceptance.record_acceptance(proposed, accepted)
        update = self._emit(emitted, list(logits[path]), list(processed[path]), decoding)
        self.committed += [plan.tokens[i] for i in path]
        return 0, torch.tensor(path), update

    # -- helpers -----------------------------------------------------------------------------------------------
    def _emit(self, tokens: list[int], raw: list[torch.Tensor], processed: list[torch.Tensor],
              decoding: TokenDecoding | None = None, one_round: bool = False) -> Update:
        """Apply the stop rules token by token; what may be sent is this step's update. `raw[i]`/`processed[i]`
        are the logits tokens[i] came from. Tokens that could still turn out to start a dropped stop word are
        held back until that is decided, so no stream ever sends text it must take back."""
        decoding = decoding or self.decoding
        for token, raw_row, processed_row in zip(tokens, raw, processed, strict=True):
            appended = self.state.emit(token, self.stop)
            if len(self.token_logits) < len(self.state.output):  # the token was output
                self.token_logits.append(raw_row)
                if self.request.return_log_probs:
                    reported, unnormalised = decoding.log_probs(processed_row, token)
                    self.token_log_probs.append(reported)
                    self.cum_log_prob += unnormalised
            del self.token_logits[len(self.state.output):], self.token_log_probs[len(self.state.output):]
            if not appended:
                break
        output = self.state.output
        reason = self.state.finish_reason or ("round" if one_round else None)
        ready = len(output) if reason is not None else len(output) - self.stop.held_back(output)
        new = output[self.sent : ready]
        update = Update(list(new), finished=reason is not None, reason=reason, cum_log_prob=self.cum_log_prob,
                        accepted_draft_tokens=self.accepted, draft_tokens=self.drafted,
                        reused_tokens=self.handle.reused_tokens)
        if self.request.return_logits and new:
            update.logits = torch.stack(self.token_logits[self.sent : ready]).float()
        if self.request.return_log_probs:
            update.log_probs = self.token_log_probs[self.sent : ready]
        if self.context_logits is not None and self.sent == 0:
            update.context_logits = self.context_logits
        self.sent = max(self.sent, ready)
        if not update.finished:
            self.pending = [tokens[-1]]
        return update


# -- the engine -------------------------------------------------------------------------------------------------


@dataclass
class _Row:
    """One KV-cache row: the tokens it holds (exactly its committed entries) and who uses it."""

    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    owner: _Sequence | None = None
    last_used: int = 0


@dataclass
class EngineStats:
    """Counters the tests and benchmarks read."""

    forwards: int = 0  # target forwards
    steps: int = 0
    rows_forwarded: int = 0  # sum over forwards of their batch size
    max_rows: int = 0  # the most sequences one target forward ran
    batched_forwards: int = 0  # target forwards over more than one sequence
    draft_forwards: int = 0  # the proposer's model forwards (each over every sequence drafting that step)
    draft_rows: int = 0  # sum over draft forwards of the sequences drafting in them
    proposals: int = 0  # sequence steps whose block carried proposed drafts
    reused_tokens: int = 0
    admitted: int = 0
    admitted_mid_step: int = 0  # of those, admitted between a step's drafting and its verification
    speculation_disabled: int = 0  # 1 once the acceptance gate switched speculation off (for good)
    acceptance: GenerationStats = field(default_factory=GenerationStats)  # per speculation round, by position


class ServingEngine:
    """In-flight batching over `model`: at most `max_batch` active sequences of up to `max_seq_len` tokens.

    `medusa_choices` makes it a Medusa engine; `schedule` then sizes the tree by load (the first K paths of
    `medusa_choices`, whose order must keep every leading slice a tree: FasterDecoding's presets and `specbuild
    tune` trees do; K = 0: plain steps). `max_draft_len` bounds external draft tokens per request.

    `lookahead` makes it a Lookahead engine (W, N, G the largest a request may ask for); `schedule` then turns
    its windows off at the loads where its length is 0 (plain steps).

    `proposer` makes it a speculative engine of another kind (n-gram, draft model, self-draft, EAGLE-3): each step
    it drafts for every decoding sequence, `schedule` (full length: the proposer's max_draft_len) choosing K by
    load (K = 0: plain steps).
    """

    def __init__(self, model: CausalLM, *, max_batch: int, max_seq_len: int, max_draft_len: int = 0,
                 medusa_choices: Sequence[Sequence[int]] | None = None, kv_rows: int | None = None,
                 schedule: DraftSchedule | None = None, accept: AcceptRule | None = None,
                 lookahead: LookaheadConfig | None = None, proposer: Proposer | None = None) -> None:
        if proposer is not None and (lookahead is not None or medusa_choices):
            raise ValueError("an engine drafts with Medusa heads, Lookahead or a proposer, one of them")
        if lookahead is not None:
            if medusa_choices:
                raise ValueError("an engine runs Medusa or Lookahead, not both")
            lookahead = LookaheadConfig(*lookahead)
            check_lookahead(lookahead)
        self.lookahead = lookahead  # the largest (W, N, G) a request may ask for; None: no Lookahead
        self.choices = [list(path) for path in medusa_choices] if medusa_choices else None
        tree = MedusaTree.from_choices(self.choices) if self.choices else None
        if tree is not None and model.config.num_medusa_heads < tree.max_depth:
            raise ValueError(f"the Medusa tree is {tree.max_depth} deep but the checkpoint has "
                             f"{model.config.num_medusa_heads} heads")
        self.model, self.max_batch, self.max_seq_len = model, max_batch, max_seq_len
        self.max_draft_len, self.tree = max_draft_len, tree
        self.proposer = proposer
        self.schedule = schedule
        self.gate = schedule.gate() if schedule is not None else None  # acceptance switch-off (TensorRT-LLM's)
        self._trees: dict[int, MedusaTree | None] = {0: None}
        self._shallow: dict[tuple[int, int], MedusaTree] = {}  # within_depth's trees
        self.step_tree: MedusaTree | None = None  # the tree of the step being run
        self.step_lookahead = lookahead is not None  # whether the step being run runs Lookahead windows
        if tree is not None:
            self._trees[tree.num_nodes] = _on_device(tree, model.device)
        self.accept = accept or accept_rejection_sampling  # draft-target under sampling (tests swap in wrong rules)
        self.topk_size = int(tree.rank.max()) + 1 if tree is not None else 0
        # A step pads short blocks to one length; longer ones (prompts) run alone.
        self.short_block = max(16, max_draft_len + 2, (tree.num_nodes + 1) if tree is not None else 0,
                               max_block_tokens(lookahead) if lookahead is not None else 0,
                               proposer.block_tokens + 1 if proposer is not None else 0)
        self.rows_total = max(kv_rows or 0, 2 * max_batch, max_batch + 1)
        c = model.config
        self.cache = KVCache(c.num_layers + (proposer.extra_cache_layers if proposer is not None else 0),
                             self.rows_total, c.num_kv_heads, c.head_dim, max_seq_len + self.short_block + 1,
                             model.dtype, model.device)
        if proposer is not None:
            proposer.bind(self.cache)
        self.rows = [_Row() for _ in range(self.rows_total)]
        self.active: list[_Sequence] = []  # active[i].row == i
        self.waiting: deque[Handle] = deque()
        self.stats = EngineStats()
        self._clock = 0
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False

    # -- requests ------------------------------------------------------------------------------------------------
    def submit(self, request: EngineRequest) -> Handle:
        """Queue a request (thread-safe); it joins the batch at the next step."""
        self.check(request)
        handle = Handle(request)
        with self._lock:
            self.waiting.append(handle)
            self._lock.notify()
        return handle

    def check(self, request: EngineRequest) -> None:
        """ValueError for a request the engine cannot serve at all (the caller validated the rest)."""
        vocab = self.model.config.vocab_size
        if not request.prompt:
            raise ValueError("a request needs at least one prompt token")
        if min(request.prompt) < 0 or max(request.prompt) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        drafts = request.draft_tokens or []
        if len(drafts) > self.max_draft_len:
            raise ValueError(f"{len(drafts)} draft tokens is more than the engine's max_draft_len "
                             f"{self.max_draft_len}")
        if drafts and (min(drafts) < 0 or max(drafts) >= vocab):
            raise ValueError(f"draft token ids must be in [0, {vocab})")
        if len(request.prompt) + max(request.max_new_tokens, 1) > self.max_seq_len:
            raise ValueError(f"prompt {len(request.prompt)} + max_new_tokens {request.max_new_tokens} is more than "
                             f"the engine's max_seq_len {self.max_seq_len}")
        if request.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1 (got {request.max_new_tokens})")
        if request.lookahead is not None:
            if self.lookahead is None:
                raise ValueError("the request asks for Lookahead (w, n, g) but the engine was not made for Lookahead")
            problem = request_problem(LookaheadConfig(*request.lookahead), self.lookahead)
            if problem is not None:
                raise ValueError(f"lookahead (w, n, g) = {tuple(request.lookahead)}: {problem}")

    # -- running -------------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Serve from a background thread until `stop()`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="specbuild-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _serve(self) -> None:
        while True:
            with self._lock:
                while not self._stopping and not self.waiting and not self.active:
                    self._lock.wait()
                if self._stopping:
                    return
            self.step()

    def run_until_idle(self) -> None:
        """Step until nothing is waiting or active (for callers without a background thread)."""
        while self.step():
            pass

    @torch.inference_mode()
    def step(self) -> bool:
        """One scheduler iteration: drop cancelled sequences, admit waiting ones, run every active sequence's
        next block; returns whether there was anything to do."""
        self._drop_cancelled()
        running = len(self.active)
        self._admit()
        if not self.active:
            return False
        self.stats.steps += 1
        self.step_tree = tree = self.tree_for(len(self.active))
        self.step_lookahead = self.lookahead_on(len(self.active))
        if running and len(self.active) > running:
            self._prefill_first(running)
            if not self.active:
                return True
        if self.proposer is not None:
            self._propose()
            if not self.active:
                return True
            self._admit_before_verify()
        blocks = [seq.block(tree) for seq in self.active]
        for start, stop in self._groups(blocks):
            self._forward(start, stop, blocks[start:stop])
        for seq in [s for s in self.active if s.handle.done]:
            self._release(seq)
        return True

    def _prefill_first(self, running: int, *, prefix_hits: bool = True) -> None:
        """New prompts admitted this step (rows `running:`, admission appends them) run first, in forwards of their
        own, so their first token does not wait for the running sequences' drafting and verification (time to first
        token under load: a speculative step costs a few plain ones). Each then joins this step's generation like
        the running ones; those already finished (one-token requests) leave first. A request whose prompt the cache
        holds but for its newest token (a prefix hit) is one too where this step speculates for it (the proposer
        drafts, the Medusa tree is on, or it runs Lookahead): else a cache hit would make its first token wait for
        the drafts, or share a forward wider than plain, later than a miss's. In a plain step, or with
        `prefix_hits` False (the drafts are made: the verification comes next), it stays in the step's shared
        forward, as the BLS's next round (a continuation, drafts or not) always does: there its own forward would
        only cost the batch a forward. Greedy and sampled outputs are unchanged: every row's tokens depend only on
        its own sequence and random stream."""
        fresh = self.active[running:]
        drafts = self.proposer is not None and self.draft_len(len(self.active)) > 0

        def speculates(seq: _Sequence) -> bool:
            return ((seq.medusa and self.step_tree is not None) or (seq.drafting and drafts)
                    or (seq.lookahead is not None and self.step_lookahead))

        prompts = [seq for seq in fresh if len(seq.pending) > 1 or (
            prefix_hits and not seq.state.output and speculates(seq))]
        if not prompts:
            return
        # The new prompts to the last rows, after the continuations (active[i].row == i throughout).
        first = {id(seq) for seq in prompts}
        for index, seq in enumerate([s for s in fresh if id(s) not in first] + prompts, start=running):
            self._move(seq, index)
        start = len(self.active) - len(prompts)
        blocks = [seq.block(None) for seq in self.active[start:]]
        for lo, hi in self._groups(blocks):
            self._forward(start + lo, start + hi, blocks[lo:hi])
        for seq in [s for s in self.active if s.handle.done]:
            self._release(seq)

    def _admit_before_verify(self) -> None:
        """Requests that arrived while the proposer drafted are admitted now and their prompts run before the
        verification forward, instead of waiting for the whole step: under a closed load a finished request's
        successor arrives just after a step began, so its first token would otherwise wait for that step's drafts
        *and* verification. They join the verification forward without drafts (the proposer drafts for them from
        the next step on). Tokens are unchanged: each row's output depends only on its own sequence."""
        with self._lock:
            if not self.waiting or len(self.active) >= self.max_batch:
                return
        running = len(self.active)
        self._admit()
        self.stats.admitted_mid_step += len(self.active) - running
        if len(self.active) > running:
            self._prefill_first(running, prefix_hits=False)

    def _move(self, seq: _Sequence, index: int) -> None:
        """Put `seq` on active row `index`, swapping with the sequence there (rows and KV rows together)."""
        row = seq.row
        if row != index:
            self.active[row], self.active[index] = self.active[index], self.active[row]
            self._swap(row, index)

    def lookahead_on(self, active: int) -> bool:
        """Whether a step with `active` sequences runs Lookahead windows: in a Lookahead engine, unless its
        schedule's length at this load is 0. While off, its sequences step plainly (their outputs unchanged) and
        their windows resume where they were when it is on again."""
        if self.lookahead is None or (self.gate is not None and self.gate.disabled):
            return False
        return self.schedule is None or self.schedule.draft_len(active) > 0

    def draft_len(self, active: int) -> int:
        """K for a step with `active` sequences: the schedule's, else the proposer's full length."""
        full = self.proposer.max_draft_len if self.proposer is not None else self.max_draft_len
        if self.gate is not None and self.gate.disabled:
            return 0
        return full if self.schedule is None else min(self.schedule.draft_len(active), full)

    def _propose(self) -> None:
        """The proposer drafts, in one batch, for every sequence in generation (past its prompt, as TensorRT-LLM
        drafts for generation requests only; its next block is its newest token): at most K tokens, and no more than
        it may still emit. A draft that fails fails its sequences."""
        assert self.proposer is not None
        k = self.draft_len(len(self.active))
        if k <= 0:
            return
        seqs, ks = [], []
        for seq in self.active:
            left = seq.request.max_new_tokens - len(seq.state.output) - 1
            if seq.drafting and not seq.verify and seq.state.output and len(seq.pending) == 1 and left > 0:
                seqs.append(seq)
                ks.append(min(k, left))
        if not seqs:
            return
        before = (self.proposer.stats.forwards, self.proposer.stats.rows)
        try:
            proposals = self.proposer.propose(seqs, ks)
        except Exception as err:  # the draft failed: its sequences fail, the engine goes on
            for seq in seqs:
                self._finish(seq, Update([], True, "error", error=f"draft: {type(err).__name__}: {err}"))
                self._release(seq)
            return
        self.stats.draft_forwards += self.proposer.stats.forwards - before[0]
        self.stats.draft_rows += self.proposer.stats.rows - before[1]
        for seq, proposal in zip(seqs, proposals, strict=True):
            seq.proposal = proposal
            self.stats.proposals += proposal is not None

    def _groups(self, blocks: list[_Block]) -> list[tuple[int, int]]:
        """Row ranges that share a forward: runs of short blocks; long ones (prompts) together when every row's
        padded block fits its cache row, else each alone. Admission keeps long blocks at the end."""
        groups: list[tuple[int, int]] = []
        long_rows: list[int] = []
        start = None
        for i, block in enumerate(blocks):
            if len(block.tokens) > self.short_block:
                long_rows.append(i)
                if start is not None:
                    groups.append((start, i))
                    start = None
            elif start is None:
                start = i
        if start is not None:
            groups.append((start, len(blocks)))
        if long_rows:
            width = max(len(blocks[i].tokens) for i in long_rows)
            contiguous = long_rows == list(range(long_rows[0], long_rows[-1] + 1))
            fits = all(blocks[i].positions[0] + width <= self.cache.max_len for i in long_rows)
            if contiguous and fits:
                groups.append((long_rows[0], long_rows[-1] + 1))
            else:
                groups += [(i, i + 1) for i in long_rows]
        return sorted(groups)

    def _forward(self, start: int, stop: int, blocks: list[_Block]) -> None:
        width = max(len(b.tokens) for b in blocks)
        batch = len(blocks)
        # Padding: token 0 at any valid position (the row's last); its outputs are dropped.
        ids = torch.tensor([[*b.tokens, *[0] * (width - len(b.tokens))] for b in blocks], dtype=torch.long)
        positions = torch.tensor([[*b.positions, *[b.positions[-1]] * (width - len(b.positions))] for b in blocks],
                                 dtype=torch.long)
        trees = any(b.tree is not None or b.mask is not None for b in blocks)
        mask = torch.stack([_row_mask(b, width) for b in blocks]) if trees else None
        view = self.cache.view(start, stop)
        sequences = self.active[start:stop]
        proposer = self.proposer
        try:
            out = self.model(ids, view, position_ids=positions, tree_mask=mask,
                             side_layers=proposer.side_layers if proposer is not None else None,
                             capture_layers=proposer.capture_layers if proposer is not None else ())
        except Exception as err:  # a failed forward fails its sequences, not the engine
            for seq in sequences:
                self._finish(seq, Update([], True, "error", error=f"{type(err).__name__}: {err}"))
            return
        self.stats.forwards += 1
        self.stats.rows_forwarded += batch
        self.stats.max_rows = max(self.stats.max_rows, batch)
        self.stats.batched_forwards += batch > 1
        features = torch.cat(out.captured, dim=-1) if out.captured else None  # [B, T, F] for the proposer
        counts = torch.zeros(batch, dtype=torch.long)
        paths: list[tuple[int, torch.Tensor]] = []
        updates = []
        for i, (seq, block) in enumerate(zip(sequences, blocks, strict=True)):
            commit, path, update = seq.after(block, out, i)
            counts[i] = commit
            if path is not None:
                paths.append((i, path))
            if features is not None and proposer is not None:
                kept = path if path is not None else torch.arange(commit)
                proposer.observe(seq, features[i, kept.to(features.device)])
            updates.append(update)
        view.advance(counts)
        for i, path in paths:
            view.compact(i, path)
        self._head_guesses(sequences, out)
        for seq, update in zip(sequences, updates, strict=True):
            self.rows[seq.row].tokens = np.asarray(seq.committed, dtype=np.int64)
            if update.finished:
                self._finish(seq, update)
            else:
                seq.handle._record(update)

    def tree_for(self, active: int) -> MedusaTree | None:
        """The Medusa tree for a step with `active` sequences: the schedule's first K paths (None: no tree)."""
        if self.tree is None:
            return None
        k = self.tree.num_nodes if self.schedule is None else min(self.schedule.draft_len(active),
                                                                   self.tree.num_nodes)
        if self.gate is not None and self.gate.disabled:
            k = 0
        if k not in self._trees:
            assert self.choices is not None
            try:
                self._trees[k] = _on_device(MedusaTree.from_choices(self.choices[:k]), self.model.device)
            except ValueError as err:
                raise ValueError(f"the first {k} Medusa paths are not a tree ({err}): order medusa_choices so "
                                 "that every path comes after its prefix") from None
        return self._trees[k]

    def within_depth(self, tree: MedusaTree, depth: int) -> MedusaTree:
        """`tree` cut to `depth` (MedusaTree.within_depth), kept per engine tree and depth, on the model's device."""
        if tree.max_depth <= depth:
            return tree
        key = (tree.num_nodes, depth)
        if key not in self._shallow:
            self._shallow[key] = _on_device(tree.within_depth(depth), self.model.device)
        return self._shallow[key]

    def _head_guesses(self, sequences: list[_Sequence], out: ForwardOutput) -> None:
        """Every Medusa head's top-k at each asking row's position, in one batched call of the heads."""
        asking = [(i, seq) for i, seq in enumerate(sequences) if seq.heads_at is not None]
        if not asking:
            return
        hidden = torch.stack([out.hidden[i, seq.heads_at] for i, seq in asking])[:, None]  # [n, 1, H]
        # As many heads as this load's tree is deep: at a higher load (a shallower tree) the deeper heads' guesses
        # would go unread; a row whose next step's tree is deeper (the load fell) verifies it within this depth.
        tree = self.step_tree or self.tree
        assert tree is not None
        logits = self.model.medusa_logits(hidden, tree.max_depth)[:, :, 0]  # [heads, n, V]
        topk = torch.topk(logits, self.topk_size, dim=-1).indices.transpose(0, 1).tolist()  # [n][heads][k]
        for (_, seq), guesses in zip(asking, topk, strict=True):
            seq.topk, seq.heads_at = guesses, None

    # -- rows ------------------------------------------------------------------------------------------------------
    def _admit(self) -> None:
        """Waiting requests join while there is room; within a step, prompts that must run alone come last so
        the short blocks stay one contiguous run of rows."""
        with self._lock:
            room = self.max_batch - len(self.active)
            joining = [self.waiting.popleft() for _ in range(min(room, len(self.waiting)))]
        joining.sort(key=lambda h: len(h.request.prompt) + len(h.request.draft_tokens or ()))
        for handle in joining:
            if handle.cancelled:
                handle._record(Update([], True, "cancelled"))
                continue
            seq = _Sequence(handle, self)
            self._place(seq)
            handle.first_scheduled_time = time.time()
            self.stats.admitted += 1

    def _place(self, seq: _Sequence) -> None:
        """Give `seq` row len(active), reusing the longest cached prefix of its prompt."""
        self._clock += 1
        prompt = np.asarray(seq.request.prompt, dtype=np.int64)
        # The last prompt token is always computed (its logits are needed); context logits need them all.
        limit = 0 if seq.request.return_context_logits else len(prompt) - 1
        best, match = -1, 0
        for index, row in enumerate(self.rows):
            n = min(_common_prefix(row.tokens, prompt), limit)
            if n and self.proposer is not None:
                n = self.proposer.reusable(index, prompt, n)
            if n > match:
                best, match = index, n
        dest = len(self.active)
        source = dest
        if best >= dest:  # a free row holds the prefix: bring it to the active end
            self._swap(best, dest)
        else:
            victim = min(range(dest, self.rows_total), key=lambda i: self.rows[i].last_used)
            self._swap(victim, dest)
            if best >= 0 and match:
                self.cache.copy_prefix(best, dest, match)
                source = best
        self.cache.truncate_row(dest, match)
        row = self.rows[dest]
        row.tokens, row.owner, row.last_used = prompt[:match].copy(), seq, self._clock
        seq.row, seq.committed, seq.pending = dest, prompt[:match].tolist(), prompt[match:].tolist()
        seq.handle.reused_tokens = match
        self.stats.reused_tokens += match
        if self.proposer is not None:
            self.proposer.admit(seq, source, prompt, match)
        self.active.append(seq)

    def _swap(self, a: int, b: int) -> None:
        if a == b:
            return
        self.cache.swap_rows(a, b)
        if self.proposer is not None:
            self.proposer.swap_rows(a, b)
        self.rows[a], self.rows[b] = self.rows[b], self.rows[a]
        for index in (a, b):
            owner = self.rows[index].owner
            if owner is not None:
                owner.row = index

    def _finish(self, seq: _Sequence, update: Update) -> None:
        seq.handle._record(update)

    def _release(self, seq: _Sequence) -> None:
        """A finished sequence leaves the active rows; its row joins the pool with what it holds. A sequence that
        could speculate and completed (not failed or cancelled) counts towards the acceptance gate."""
        result = seq.handle.result
        if (self.gate is not None and result is not None and result.reason in ("length", "end_id", "stop_word")
                and (seq.drafting or seq.medusa or seq.lookahead is not None)):
            self.stats.speculation_disabled += self.gate.record(len(seq.state.output), seq.iterations)
        if self.proposer is not None:
            self.proposer.release(seq)
        last = len(self.active) - 1
        row = seq.row
        self.active[row], self.active[last] = self.active[last], self.active[row]
        self._swap(row, last)
        self.active.pop()
        released = self.rows[last]
        released.owner, released.last_used = None, self._clock

    def _drop_cancelled(self) -> None:
        for seq in [s for s in self.active if not s.handle.done and (
                s.handle.cancelled or (s.request.cancelled is not None and s.request.cancelled()))]:
            error = seq.handle.callback_error
            self._finish(seq, Update([], True, "error" if error else "cancelled", cum_log_prob=seq.cum_log_prob,
                                     accepted_draft_tokens=seq.accepted, draft_tokens=seq.drafted,
                                     reused_tokens=seq.handle.reused_tokens, error=error))
            self._release(seq)


def _row_mask(block: _Block, width: int) -> torch.Tensor:
    """[width, width] bool on the CPU: a tree or Lookahead row's own mask, padded with rows that see only
    themselves; a causal row's lower triangle."""
    own = block.tree.attention_mask if block.tree is not None else block.mask
    if own is None:
        return torch.ones(width, width, dtype=torch.bool).tril_()
    own = own.cpu()
    n = own.shape[0]
    if n == width:
        return own
    mask = torch.eye(width, dtype=torch.bool)
    mask[:n, :n] = own
    return mask


def _seed(request: EngineRequest, decoding: TokenDecoding) -> int:
    """The runtime's decoding: a seeded request draws differently at each sequence length (speculation rounds of
    one sequence do not repeat their draws) and for verification than for generation (a draft's draws and the
    target's acceptance test of them must be independent); an unseeded one draws from a random seed. Other
    decodings (TensorRT-LLM's) seed with their own seed as it is."""
    seed = decoding.seed
    if seed is None:
        return int(torch.seed())
    if not isinstance(decoding, SamplingDecoding):
        return seed
    return (seed * 1_000_003 + 2 * len(request.prompt) + (request.draft_tokens is not None)) % (2**63)


def _on_device(tree: MedusaTree, device: torch.device) -> MedusaTree:
    """The tree's index tensors on the model's device, so a CUDA step never mixes devices."""
    return dataclasses.replace(
        tree, depth=tree.depth.to(device), parent=tree.parent.to(device), rank=tree.rank.to(device),
        attention_mask=tree.attention_mask.to(device), retrieve_indices=tree.retrieve_indices.to(device),
    )


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n
