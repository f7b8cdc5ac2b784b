"""A finished agent trace laid out as one training row (`rollout_sample`): the prompt, the completion
with its env mask and sampled log-probs, each decision step's case (token-exact, text-continued,
fresh-prompt) and the position ids that restart where a step starts a segment of its own. It reads
traces and a back-end's tokenizer only: no model, no trainer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from metarag.errors import DataError
from metarag.policy.agent_trace import decision_generations
from metarag.records import Generate, Trace

# layout of a decision step inside its rollout's sequence (see `rollout_sample`)
TOKEN_EXACT, TEXT_CONTINUED, FRESH_PROMPT = "token-exact", "text-continued", "fresh-prompt"
LAYOUTS = (TOKEN_EXACT, TEXT_CONTINUED, FRESH_PROMPT)
POSITIONS_FIELD = "rollout_positions"  # the rollout_func's column of completion position ids


@dataclass(frozen=True)
class RolloutSample:
    """One rollout as TRL trains it: `prompt_ids` (the first step's prompt, as the back-end
    tokenized it), `completion_ids` (everything after), `env_mask` (1 on the tokens the model
    generated, 0 on injected ones), `logprobs` (the sampled log-prob of each generated token; 0.0 on
    injected tokens, which carry none: a NaN there would reach TRL's importance correction),
    `layout` (each decision step's case: token-exact, text-continued or fresh-prompt, see
    `rollout_sample`), `spans` (where each step's generated ids lie in the completion: start, end),
    `positions` (the position id of each completion token: counting on from the prompt, and from 0
    again where a fresh-prompt step starts a segment of its own; `StepPackedGRPOTrainer` restarts
    attention there too)."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    env_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    layout: tuple[str, ...]
    spans: tuple[tuple[int, int], ...] = ()
    positions: tuple[int, ...] = ()

    @property
    def packed(self) -> bool:
        """Whether some step starts a segment of its own (its positions restart at 0)."""
        return FRESH_PROMPT in self.layout


def step_generations(trace: Trace) -> list[Generate]:
    """The trace's decision-step generations by the run's own model, in order (the probe's Score
    steps and any other model's calls are not trained on)."""
    return [s for s in decision_generations(trace) if not s.model]


def rollout_sample(trace: Trace, llm: Any) -> RolloutSample:
    """Lay a finished agent trace out as one sequence with a mask. `llm` is the back-end the rollout
    ran on (its `tokenize`, `detokenize` and `render`, i.e. how it turned each step's prompt into ids).

    Step 0's prompt ids are the prompt. Each step k's generated ids follow with mask 1. Before them,
    what step k's prompt adds to the sequence so far, with mask 0:
    - token-exact: step k's prompt ids start with the sequence so far (search-r1: the transcript
      grew by the `<information>` block); the rest of its ids. The model read exactly this.
    - text-continued: not as ids but as text (the back-end re-tokenized the transcript, e.g. a stop
      token whose piece ran past `</search>`, or sampled ids that tokenize differently); the rest of
      the text, tokenized. The same text as the model read, tokenized once.
    - fresh-prompt: step k's prompt is no continuation (belief-agent's re-built step prompt); all
      of its ids, as a new segment: its positions start again at 0 and the trainer lets it attend
      only to itself (`StepPackedGRPOTrainer`), so step k is trained on exactly the context it was
      sampled from. The sequence is then n steps packed in one row, sharing the rollout's advantage
      (one row per rollout keeps TRL's groups of G; verl-agent's per-step samples, packed).
    A trace with no generation (it failed first) gets one masked end-of-sequence token."""
    generations = step_generations(trace)
    eos = _eos_id(llm)
    if not generations:
        return RolloutSample((eos,), (eos,), (0,), (0.0,), (), (), (1,))

    prompt = step_prompt_ids(generations[0], llm)
    sequence = list(prompt)  # what the current segment's next token reads
    completion: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    positions: list[int] = []
    layout: list[str] = []
    spans: list[tuple[int, int]] = []
    for k, g in enumerate(generations):
        if k == 0:
            layout.append(TOKEN_EXACT)
        else:
            ctx = step_prompt_ids(g, llm)
            if ctx[:len(sequence)] == sequence:
                added, case = ctx[len(sequence):], TOKEN_EXACT
            else:
                said, read = llm.detokenize(sequence), llm.detokenize(ctx)
                if read.startswith(said):
                    added, case = list(llm.piece_tokens(read[len(said):])), TEXT_CONTINUED
                else:
                    added, case = ctx, FRESH_PROMPT
                    sequence = []  # a segment of its own: positions and attention start again
            layout.append(case)
            positions += range(len(sequence), len(sequence) + len(added))
            completion += added
            mask += [0] * len(added)
            logprobs += [0.0] * len(added)
            sequence += added
        ids, lps = step_token_ids(g, trace.question_id)
        spans.append((len(completion), len(completion) + len(ids)))
        positions += range(len(sequence), len(sequence) + len(ids))
        completion += ids
        mask += [1] * len(ids)
        logprobs += lps
        sequence += ids
    if not completion:  # an empty first generation that ended the trace
        completion, mask, logprobs, positions = [eos], [0], [0.0], [len(prompt)]
    return RolloutSample(tuple(prompt), tuple(completion), tuple(mask), tuple(logprobs), tuple(layout),
                         tuple(spans), tuple(positions))


def step_prompt_ids(g: Generate, llm: Any) -> list[int]:
    """The ids a decision step's prompt was fed as: its recorded `prompt_ids`, or its prompt rendered
    and tokenized by `llm` (the back-end it ran on)."""
    from metarag.llm.base import prompt_text

    if g.prompt_ids:
        return list(g.prompt_ids)
    return list(llm.tokenize(prompt_text(llm, g.prompt))) if g.prompt else []


def step_token_ids(g: Generate, question_id: str) -> tuple[list[int], list[float]]:
    """The ids and sampled log-probs a decision step generated, as its trace recorded them."""
    tokens = g.logprobs or ()
    if not tokens and g.text:
        raise DataError(f"trace of question {question_id!r}: a decision step recorded without its "
                        "tokens; the agent asks with logprobs=1")
    if any(t.id is None for t in tokens):
        raise DataError(f"trace of question {question_id!r}: the back-end returned no token ids")
    return [int(t.id) for t in tokens], [float(t.logprob) for t in tokens]


def _eos_id(llm: Any) -> int:
    tokenizer = getattr(llm, "tokenizer", None)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        return int(tokenizer.eos_token_id)
    ids = llm.tokenize("<|im_end|>")
    return ids[-1] if ids else 0
