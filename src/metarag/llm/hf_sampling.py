"""The next-token pickers of the transformers back-end's decoding loop (`metarag.llm.hf`): the shared
rule of `metarag.llm.base` run in numpy on the host, row by row (`HostSampler`, the reference), or in
torch on the logits' device, every row at once (`DeviceSampler`, `HFSettings.sampling` "device")."""
from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Any

from metarag.llm.base import Decoding, entropy_of, log_softmax, sample_token, top_alternatives

# What a sampler gives for each unfinished row: the token, its log-prob and the entropy of the model's
# own (temperature 1) distribution, and its top alternatives as (id, log-prob), best first; for an
# end-of-sequence token, which is never kept, the host sampler computes none of them.
Picked = tuple[int, float, "float | None", tuple[tuple[int, float], ...]]


class HostSampler:
    """The shared rule run in numpy on the host (`metarag.llm.base.sample_token`): each step copies the
    logit rows to the host and picks row by row."""

    def __init__(self, rows: Sequence[Sequence[int]], decodings: Sequence[Decoding], rngs: Sequence[Any],
                 eos: Collection[int]):
        self.rows, self.decodings, self.rngs, self.eos = rows, decodings, rngs, eos

    def __call__(self, logits: Any, done: Sequence[bool], outs: Sequence[Sequence[int]]) -> list[Picked | None]:
        table = logits.float().cpu().numpy()
        picked: list[Picked | None] = [None] * len(table)
        for i, d in enumerate(self.decodings):
            if done[i]:
                continue
            history = list(self.rows[i]) + list(outs[i]) if d.repetition_penalty != 1.0 else ()
            token = sample_token(table[i], d, self.rngs[i], history)
            if token in self.eos:  # ends the row, never kept: nothing more to compute
                picked[i] = (token, 0.0, None, ())
                continue
            lp = log_softmax(table[i])
            picked[i] = (token, float(lp[token]), entropy_of(lp), top_alternatives(lp, d.logprobs, int))
        return picked


class DeviceSampler:
    """The shared rule run in torch on the logits' device, for every unfinished row at once: the
    repetition penalty, greedy argmax, temperature, top-k (ties at the cut kept) and top-p as
    `metarag.llm.base.sample_token` applies them, in float64; each sampled row's draw is the inverse-CDF
    search numpy's `Generator.choice` makes (cumulative sum, divided by its last value, the first entry
    above the uniform), the uniform drawn from the row's own numpy generator, so a seed gives the host
    rule's tokens up to the rounding of the sums. Only the picked ids, log-probs, entropies and top
    alternatives are copied back."""

    def __init__(self, torch: Any, rows: Sequence[Sequence[int]], decodings: Sequence[Decoding], rngs: Sequence[Any]):
        self.torch, self.rows, self.decodings, self.rngs = torch, rows, decodings, rngs
        self.seen = None  # (rows, vocabulary) bool: the ids of each row's prompt and output, for the penalty
        self.counted = [0] * len(rows)  # output tokens of each row already marked in `seen`

    def __call__(self, logits: Any, done: Sequence[bool], outs: Sequence[Sequence[int]]) -> list[Picked | None]:
        torch = self.torch
        live = [i for i in range(len(done)) if not done[i]]
        decodings = [self.decodings[i] for i in live]
        where = torch.tensor(live, device=logits.device)
        x = logits.index_select(0, where).double()
        top, best = x.max(dim=-1, keepdim=True)  # the largest logit and its first id
        e = torch.exp(x - top)
        total = e.sum(dim=-1, keepdim=True)
        p = e / total  # the model's own distribution (temperature 1), as the host rule computes it
        lse = top + total.log()  # a token's log-prob is its logit minus this
        entropy = lse[:, 0] - (p * x).nansum(dim=-1)  # a -inf logit has p 0: its term is 0, not nan
        penalized = any(d.repetition_penalty != 1.0 for d in decodings)
        z = self._penalized(x, where, live, outs) if penalized else x
        tokens = z.max(dim=-1).indices if penalized else best[:, 0].clone()
        hot = [j for j, d in enumerate(decodings) if d.temperature > 0]
        if hot:
            tokens[hot] = self._drawn(z, p, hot, decodings, [self.rngs[live[j]] for j in hot])
        k = min(max(d.logprobs for d in decodings), x.shape[-1])
        columns = [tokens.double()[:, None], x.gather(1, tokens[:, None]) - lse, entropy[:, None]]
        if k:  # ids as float64 hold any vocabulary's ids exactly
            values, ids = (top, best) if k == 1 else x.topk(k, dim=-1)
            columns += [ids.double(), values - lse]
        table = torch.cat(columns, dim=1).cpu().tolist()  # the one copy to the host this step
        picked: list[Picked | None] = [None] * len(done)
        for i, d, row in zip(live, decodings, table):
            top_ids = tuple((int(row[3 + a]), row[3 + k + a]) for a in range(min(d.logprobs, k)))
            picked[i] = (int(row[0]), row[1], row[2], top_ids)
        return picked

    def _penalized(self, x: Any, where: Any, live: Sequence[int], outs: Sequence[Sequence[int]]) -> Any:
        """`x` with the repetition penalty on every id each row's prompt or output so far holds."""
        torch = self.torch
        if self.seen is None:
            self.seen = torch.zeros((len(self.rows), x.shape[-1]), dtype=torch.bool, device=x.device)
            for i, row in enumerate(self.rows):
                self.seen[i, torch.tensor(list(row), dtype=torch.long, device=x.device)] = True
        for i in live:
            new = outs[i][self.counted[i]:]
            if new:
                self.seen[i, torch.tensor(list(new), dtype=torch.long, device=x.device)] = True
                self.counted[i] = len(outs[i])
        penalty = torch.tensor([self.decodings[i].repetition_penalty for i in live], dtype=x.dtype,
                               device=x.device)[:, None]
        seen = self.seen.index_select(0, where)
        return torch.where(seen & (penalty != 1.0), torch.where(x > 0, x / penalty, x * penalty), x)

    def _drawn(self, z: Any, p: Any, hot: Sequence[int], decodings: Sequence[Decoding], rngs: Sequence[Any]) -> Any:
        """One token for each row `hot` of `z` (float64 logits, penalty applied), drawn with `rngs`: from
        `p` (the distribution at temperature 1) where nothing reshapes it, else by `_distribution`."""
        torch = self.torch
        shaped = [a for a, j in enumerate(hot) if decodings[j].temperature != 1.0 or decodings[j].top_k
                  or decodings[j].top_p < 1.0 or decodings[j].repetition_penalty != 1.0]
        probs = p if not shaped and len(hot) == len(p) else p[list(hot)]
        if shaped:
            rows = [hot[a] for a in shaped]
            probs[shaped] = self._distribution(z[rows], [decodings[j] for j in rows])
        cdf = probs.cumsum(dim=-1)
        cdf = cdf / cdf[:, -1:]
        uniform = torch.tensor([[rng.random()] for rng in rngs], dtype=z.dtype, device=z.device)
        return torch.searchsorted(cdf, uniform, right=True)[:, 0].clamp(max=z.shape[-1] - 1)

    def _distribution(self, z: Any, decodings: Sequence[Decoding]) -> Any:
        """The distribution each row of `z` is drawn from: softmax at its temperature over its top-k
        (ties at the cut kept), cut to its top-p nucleus."""
        torch = self.torch
        vocab = z.shape[-1]
        scaled = z / torch.tensor([d.temperature for d in decodings], dtype=z.dtype, device=z.device)[:, None]
        cut = [j for j, d in enumerate(decodings) if 0 < d.top_k < vocab]
        if cut:
            ks = torch.tensor([decodings[j].top_k for j in cut], device=z.device)
            best = scaled[cut].topk(int(ks.max()), dim=-1).values
            kth = best.gather(1, (ks - 1)[:, None])
            scaled[cut] = torch.where(scaled[cut] >= kth, scaled[cut], torch.full_like(scaled[cut], -math.inf))
        p = torch.exp(scaled - scaled.max(dim=-1, keepdim=True).values)
        p = p / p.sum(dim=-1, keepdim=True)
        nucleus = [j for j, d in enumerate(decodings) if d.top_p < 1.0]
        if nucleus:
            top_p = torch.tensor([decodings[j].top_p for j in nucleus], dtype=z.dtype, device=z.device)[:, None]
            ordered, order = p[nucleus].sort(dim=-1, descending=True, stable=True)
            keep = (ordered.cumsum(dim=-1) < top_p).sum(dim=-1, keepdim=True) + 1
            ordered = torch.where(torch.arange(vocab, device=z.device)[None, :] < keep, ordered,
                                  torch.zeros_like(ordered))
            kept = torch.zeros_like(ordered).scatter(1, order, ordered)
            p[nucleus] = kept / kept.sum(dim=-1, keepdim=True)
        return p
