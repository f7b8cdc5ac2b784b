"""How far a trained policy has moved from the model it started from, measured where it acts.

The paper's trainer keeps a KL term to the reference model and logs it; the cpu recipe trains with
KL 0 and no reference pass (`AgentTrainSettings.kl_coef`), so a run's log has no KL. This measures it
afterwards, exactly: for each token an agent generated (the decision steps of an eval run's traces),
KL(π_trained ‖ π_start) over the whole vocabulary at that position, the trained policy being the
start model with a checkpoint's LoRA adapter on and π_start the same model with it off (one model in
memory, several adapters). Beside it, the share of positions whose greedy token differs (a KL of
1e-4 nats a token changes no greedy choice; the held-out evaluation decodes greedily) and the change
of each reply's own log-probability.

The replies are read, not sampled: the KL is the expectation under the trained policy's next-token
distribution at the contexts the replies visit (exact at each position), so replies of the untrained
model (the held-out baseline run) measure the drift on the states the untrained agent reaches, and
replies of a trained checkpoint's run on its own. Each decision step is scored on its own prompt, as
the back-end rendered and tokenized it (`HFLLM.render`, `tokenize`), its generated token ids after.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from metarag.errors import DataError
from metarag.records import Trace


@dataclass(frozen=True)
class Reply:
    """One decision step as the model read and wrote it: its prompt's ids, the ids it generated."""

    question_id: str
    prompt_ids: tuple[int, ...]
    reply_ids: tuple[int, ...]


@dataclass(frozen=True)
class Drift:
    """One adapter's distance from the start model over a set of replies. KL in nats: `kl_per_token`
    the mean over all reply tokens, `kl_per_reply` the mean over replies of their summed KL (TRL logs
    the per-token mean of its estimator; a reply's sum is what a sequence-level penalty would see),
    `kl_max` the largest at one position; `greedy_flips` the share of positions whose argmax token
    differs; `logprob_change` the mean over replies of Σ log π_trained(x_t) − log π_start(x_t) of the
    reply's own tokens (positive: the trained policy makes these replies more likely)."""

    adapter: str
    replies: int
    tokens: int
    kl_per_token: float
    kl_per_reply: float
    kl_max: float
    greedy_flips: float
    logprob_change: float


def trace_replies(traces: Iterable[Trace], llm: Any) -> list[Reply]:
    """The decision steps of `traces` as (prompt ids, generated ids), in order. `llm` renders and
    tokenizes each step's prompt as the transformers back-end does; the generated ids are the ones the
    trace recorded (the agent asks with logprobs=1, so each token carries its id)."""
    from metarag.train.agent.layout import step_generations, step_prompt_ids, step_token_ids

    replies = []
    for trace in traces:
        for g in step_generations(trace):
            ids, _ = step_token_ids(g, trace.question_id)  # as the trainer reads a rollout's steps
            if ids:  # an empty reply: nothing generated, nothing to score
                replies.append(Reply(trace.question_id, tuple(step_prompt_ids(g, llm)), tuple(ids)))
    return replies


def policy_drift(model: Any, adapters: Sequence[str], replies: Sequence[Reply]) -> list[Drift]:
    """Drift of each named adapter of `model` (a peft `PeftModel` holding them all) from the model
    with its adapters off, over `replies`. One forward pass of the start model and one per adapter a
    reply, keeping only the logits of the reply's positions (`logits_to_keep`)."""
    import torch

    if not replies:
        raise DataError("no replies to score: the traces hold no decision step with generated tokens")
    sums = {name: {"kl": 0.0, "flips": 0, "lp": 0.0, "max": 0.0} for name in adapters}
    tokens = 0
    was = getattr(model, "active_adapter", None)
    model.eval()
    with torch.no_grad():
        for reply in replies:
            ids = torch.tensor([list(reply.prompt_ids) + list(reply.reply_ids)])
            n = len(reply.reply_ids)

            with model.disable_adapter():
                start = _reply_logp(model, ids, n)
            target = torch.tensor(reply.reply_ids)
            start_taken = start.gather(1, target[:, None])[:, 0]
            start_greedy = start.argmax(-1)
            for name in adapters:
                model.set_adapter(name)
                trained = _reply_logp(model, ids, n)
                kl = (trained.exp() * (trained - start)).sum(-1).clamp_min(0.0)  # exact, per position
                s = sums[name]
                s["kl"] += float(kl.sum())
                s["max"] = max(s["max"], float(kl.max()))
                s["flips"] += int((trained.argmax(-1) != start_greedy).sum())
                s["lp"] += float((trained.gather(1, target[:, None])[:, 0] - start_taken).sum())
            tokens += n
    if isinstance(was, str):
        model.set_adapter(was)
    return [Drift(name, len(replies), tokens, s["kl"] / tokens, s["kl"] / len(replies), s["max"],
                  s["flips"] / tokens, s["lp"] / len(replies)) for name, s in sums.items()]


def _reply_logp(model: Any, ids: Any, n: int) -> Any:
    """The log-softmax at the n positions that predict a sequence's last n tokens."""
    import torch

    logits = model(input_ids=ids, logits_to_keep=n + 1).logits[0, :n].float()
    return torch.log_softmax(logits, dim=-1)


def load_adapters(model: Any, folders: Sequence[tuple[str, str]]) -> Any:
    """`model` with each (name, PEFT adapter folder) loaded as a named adapter: a `PeftModel`."""
    from peft import PeftModel

    (first, folder), *rest = folders
    peft_model = PeftModel.from_pretrained(model, folder, adapter_name=first)
    for name, folder in rest:
        peft_model.load_adapter(folder, adapter_name=name)
    return peft_model
