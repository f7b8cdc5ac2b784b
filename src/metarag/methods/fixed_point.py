"""Fixed points of iterative methods: one rule, carried out by the runner, for every method's loop.

An iterative method (MetaRAG, EvoCtx, IterDRAG) yields `LoopState(state, iteration, last)` before
each iteration of its loop: `state` is everything the rest of the loop depends on (what goes into
its next prompt: evidence, guidance, sub-queries ...). Under deterministic decoding the same state
gives the same requests, the same answers and the same next state, so once a state comes back the
loop can only cycle through the iterations it has already run: nothing new can happen. The runner
then answers with a `FixedPoint` and records a `Decide("fixed-point", "stop", ...)` step naming the
iteration, the one it repeats and the one whose outcome the full loop would have ended with; the
method stops and returns that outcome. Otherwise the runner answers None (go on) and records nothing,
so a trace without a fixed point is the trace the full loop gives.

The outcome is the full loop's, not a guess: with iteration i repeating j (period p = i - j), the
full loop would run iterations i .. last as j .. i-1 again and again, none of which stopped the loop
before, so it ends as iteration `ends_as = j + (last - j) mod p` did (for p = 1: as the last one).

The rule is off (always "go on") under sampled decoding: a run with `Runtime.sampling`, or a
question any of whose requests so far was decoded at a temperature above 0. There the same state
need not give the same answer (training rollouts sample on purpose). Each method switches the rule
off with its `stop_at_fixed_point` setting (False: the papers' full loops).
"""
from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from metarag.errors import ConfigError
from metarag.records import Decide, Usage


@dataclass(frozen=True)
class LoopState:
    """Action: the method's loop is about to start iteration `iteration` (counted from 0) from
    `state`, a hashable value (tuples of strings and numbers) holding everything the rest of the loop
    depends on. `last` is the last iteration the full loop would start (its round budget). Sends back
    None (go on) or a `FixedPoint` (stop, and end as `FixedPoint.ends_as` did)."""

    state: Hashable
    iteration: int
    last: int


@dataclass(frozen=True)
class FixedPoint:
    """The runner's "stop": iteration `iteration` starts from the state iteration `repeats` started
    from; the full loop would have ended as iteration `ends_as` (in [repeats, iteration)) did."""

    iteration: int
    repeats: int
    ends_as: int


def ends_as(iteration: int, repeats: int, last: int) -> int:
    """The iteration whose outcome a full loop that cycles from `repeats` to `iteration` ends with, the
    loop's last iteration being `last`."""
    if not 0 <= repeats < iteration:
        raise ConfigError(f"a fixed point repeats an earlier iteration, got iteration {iteration} "
                          f"repeating {repeats}")
    if last < iteration:  # the method declared a state past its own budget: it ends as this one would
        last = iteration
    return repeats + (last - repeats) % (iteration - repeats)


@dataclass
class LoopStates:
    """One question's loop states so far (the runner keeps one per question in flight), and whether
    any of its requests was sampled."""

    seen: dict[Hashable, int] = field(default_factory=dict)
    sampled: bool = False

    def check(self, action: LoopState, sampling_run: bool) -> tuple[list[Decide], FixedPoint | None]:
        """The runner's reply to `action` and the steps that record it (a Decide step when it stops)."""
        if sampling_run or self.sampled:
            return [], None
        try:
            first = self.seen.setdefault(action.state, action.iteration)
        except TypeError:
            raise TypeError(f"a loop state must be hashable (tuples, strings, numbers), got "
                            f"{type(action.state).__name__}") from None
        if first == action.iteration:
            return [], None
        fixed = FixedPoint(action.iteration, first, ends_as(action.iteration, first, action.last))
        signals = {"iteration": float(fixed.iteration), "repeats": float(fixed.repeats),
                   "ends_as": float(fixed.ends_as), "last": float(action.last)}
        return [Decide(Usage(), "fixed-point", "stop", signals)], fixed
