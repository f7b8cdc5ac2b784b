"""The search agents of the belief-action aligned agentic RAG paper (Qi et al., 2026, "MetaRAG:
Belief-Action Aligned Policy Optimization for Agentic RAG", §3.1–3.3, Appendix D.2), as policies over
the shared runner loop: `search-r1`, the Search-R1 agent (Jin et al., 2025) the paper trains from
and compares with, and `belief-agent`, the paper's agent with verify-first action generation.

One question, at most T decision steps t = 0 .. T−1, in Search-R1's format: the model reasons in
`<think> </think>` and acts with `<search> query </search>` (the top-k passages come back inside
`<information> </information>`) or `<answer> answer </answer>`, which ends the episode. Generation
stops at `</search>` / `</answer>`. Per step, in trace order (the trace contract the rewards read,
`train/rewards.py`):

1. with `probe` on: the belief probe (`judges/belief.py`, a Score step) on the step's question and
   history, then `Decide("belief", "yes"|"no", {step, b})`;
2. `belief-agent` with `verify_first`: `Decide("agent-candidate", "search"|"answer", {step})`;
3. the step's generation, a Generate step of purpose "agent-step" with per-token logprobs kept;
4. `Decide("agent-step", "search"|"answer"|"invalid", {step, forced, verified})`;
5. for a search, the Retrieve step (the query as written, k passages).

Invalid output — no complete tag pair, tags of both kinds, an empty query or answer
(`parsing.read_agent_action`) — is recorded as the action "invalid" and handled as Search-R1 does
(`generation.py`, `execute_predictions`): nothing is retrieved, the model is told its action was
invalid and how to write one, and the episode goes on; the step counts against T (the rewards'
−0.01 penalty is the trainer's, §3.5). The last step forces the answer: the model's reply is started
with `<answer>` (signal forced = 1), so every episode ends with an answer unless that one is empty.

`search-r1` keeps Search-R1's transcript: one assistant turn that grows, each step continuing it
(`Ask` with a final assistant message) after the `<information>` block or the invalid-action note
injected into it. `belief-agent` builds each step's prompt afresh from the question and the memory
of earlier steps (the paper's step prompt, with verl-agent's placeholders `{task_description}`,
`{step_count}`, `{memory_context}`), and with `verify_first` proposes a candidate action that the
model verifies before acting (the paper's Verify Instruction).

The prompts are written here in the shape of the originals (Search-R1's instruction; verl-agent's
search template, whose wording the paper's Figures 8–9 images follow); the Verify and Probe
Instructions are the paper's own words (§3.2, §3.3). The fixed-point rule is stated per step (the
transcript / the memory and step count), but cannot fire as the loops stand: every step adds to the
transcript or the memory, so no step starts from an earlier one's state.
"""
from __future__ import annotations

import functools
import hashlib
from collections.abc import Generator, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from metarag.errors import DataError
from metarag.judges.belief import belief_probe
from metarag.llm.base import Decoding
from metarag.methods.fixed_point import LoopState
from metarag.methods.runner import Policy
from metarag.parsing import agent_closing_tag, clean_answer, read_agent_action
from metarag.policy.actions import Ask, Clip, Note, Search
from metarag.records import Completion, Hit, Message, Question
from metarag.settings import check_ranges, setting

# ------------------------------------------------------------------------------------- prompts
# Search-R1's instruction (its `make_prefix` / `infer.py` prompt), our words in its shape and order.
SEARCH_R1_INSTRUCTION = (
    "Answer the question given below. Each time you receive new information, first reason about it inside "
    "<think> and </think>. If after reasoning you find that some knowledge is missing, you can call a search "
    "engine with <search> query </search>, and it returns the top search results between <information> and "
    "</information>. You may search as many times as you need. When no more outside knowledge is needed, give "
    "the answer directly inside <answer> and </answer>, with no detailed explanation, for example <answer> "
    "Lisbon </answer>. Question: {question}\n")
# Injected into the growing transcript after a search (Search-R1's observation format) ...
INFORMATION_BLOCK = "\n\n<information>{passages}</information>\n\n"
# ... one line per passage, Search-R1's `_passages2string` layout
INFORMATION_DOC = "Doc {n}(Title: {title}) {text}"
# ... after an invalid step (Search-R1 answers an invalid action with a note in the model's voice)
INVALID_NOTE = ("\nMy last action was not valid. To search, I have to put the query between <search> and "
                "</search>. To give the final answer, I have to put it between <answer> and </answer>. "
                "Let me try again.\n")
# ... and at the last step, where the answer is forced: the reply starts inside the answer tag
FORCE_NOTE = "\nI have no searches left, so I give the final answer now.\n"
FORCE_PREFIX = "<answer>"
# ... and, with belief-agent's `think_prefix`, every other step's reply starts inside the reasoning tag
THINK_PREFIX = "<think>"

# belief-agent's step prompt, in verl-agent's search-template shape (`SEARCH_TEMPLATE_NO_HIS` at
# step 0, `SEARCH_TEMPLATE` later): the question and history first (the step's context c_t, which
# the belief probe also reads), then what to do this step.
STEP_CONTEXT_FIRST = ("You are an expert agent who answers the given question step by step.\n"
                      "Your question: {task_description}\n")
STEP_CONTEXT = ("You are an expert agent who answers the given question step by step.\n"
                "Your question: {task_description}\n\n"
                "Before this step you have taken {step_count} step(s). Here is the history of those steps: "
                "your past search queries are inside <search> </search> and the results the search engine "
                "returned are inside <information> </information>.\nHistory:\n{memory_context}\n")
STEP_ACTION = (
    "\nNow it is your turn to respond for the current step.\n"
    "First reason about the step; the reasoning MUST be inside <think> </think>.\n"
    "After the reasoning, take exactly one of these actions (never both):\n"
    "(1) if some knowledge is missing, call the search engine for more outside information with "
    "<search> your query </search>;\n"
    "(2) if you know enough to answer the question confidently, give the final answer inside <answer> "
    "</answer>, with no detailed explanation, for example <answer>Lisbon</answer>.\n")
LAST_STEP = ("\nThis is your last step: no searches are left. Give the final answer to the question "
             "inside <answer> </answer>, with no detailed explanation.\n")
# The paper's Verify Instruction (§3.2), verbatim, appended to the step prompt.
VERIFY_INSTRUCTION = (
    "Before making your own decision for this step, a candidate action is proposed as: {candidate_decision}. "
    "You should first conduct reasoning, starting by verifying whether the proposed candidate action is "
    "appropriate for the current step, then determine the correct action.")
CANDIDATE_DECISION = {"search": "SEARCH (call the search engine with <search> your query </search>)",
                      "answer": "ANSWER (give the final answer inside <answer> </answer>)"}
# A memory entry per earlier step (verl-agent's history keeps the queries and the results).
MEMORY_SEARCH = "Step {n}:\n<search> {query} </search>\n<information>{passages}</information>"
MEMORY_INVALID = ("Step {n}: your reply held no valid action ({reason}), so nothing was searched. Put a query "
                  "between <search> and </search>, or the answer between <answer> and </answer>.")
# The belief probe's context for search-r1: the question and the transcript so far.
SEARCH_R1_PROBE_CONTEXT = "Question: {question}\n"
SEARCH_R1_PROBE_HISTORY = "Your reasoning, searches and the information returned so far:\n{transcript}\n"

STOP = ("</search>", "</answer>")


def format_information(hits: Sequence[Hit]) -> str:
    """The passages of one search as the `<information>` block shows them, best first."""
    return "\n".join(INFORMATION_DOC.format(n=i, title=h.passage.title, text=h.passage.text)
                     for i, h in enumerate(hits, 1))


def closed_reply(out: Completion) -> str:
    """The reply with the closing tag its stop string cut restored (a server that does not say which
    stop string fired: the tag the last opening tag needs)."""
    if out.finish_reason != "stop":
        return out.text
    return out.text + (out.stop or agent_closing_tag(out.text) or "")


def random_candidate(seed: int, question_id: str, step: int) -> str:
    """The `random` strategy's candidate: "search" or "answer", uniform, from a hash of the seed, the
    question and the step (the same on every run and process, different across steps)."""
    digest = hashlib.blake2b(f"{seed}:{question_id}:{step}".encode(), digest_size=8).digest()
    return ("search", "answer")[digest[0] & 1]


# ------------------------------------------------------------------------------------ settings
@dataclass(frozen=True)
class SearchR1Settings:
    """Search-R1 as the paper runs it (Appendix D.2, §4.1).

    T = 5 generations: Search-R1's official trainer (`generation.py`, `run_llm_loop`) runs
    `max_turns` = 4 search turns and then one final turn that can only answer; the paper's "at most 4
    turns" is that budget. The final turn is forced here by starting the reply with `<answer>` (how
    the paper forces it is left open; an untrained model cannot search past the budget and end with
    no answer). k = 3 passages per search (top-3, as Search-R1). `max_obs_tokens` = 500: an
    `<information>` block longer than that many tokens of the run's model is cut there, as the
    official `max_obs_length` (0: never cut; a back-end without a tokenizer, a server, is not cut).
    step_max_tokens = 512 per step, the paper's response budget (Appendix D.1; Search-R1's is per turn).
    `probe` runs the belief probe at every step (off: the paper probes only in training).
    `stop_at_fixed_point`: the shared rule on the transcript, which cannot fire (it grows every step).
    """

    T: int = setting(5, ge=1)
    k: int = setting(3, ge=1)
    step_max_tokens: int = setting(512, ge=1)
    max_obs_tokens: int = setting(500, ge=0)
    probe: bool = False
    stop_at_fixed_point: bool = True

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True)
class BeliefAgentSettings:
    """The paper's agent (§3.1–3.2, Appendix D.2, J), with its defaults.

    T, k, step_max_tokens, probe as `SearchR1Settings`. `verify_first` proposes a candidate action and
    asks the model to verify it first (the paper's default, at inference too; off: the Appendix J
    ablation). `candidates`, the candidate strategy (§3.2): "random" (uniform over search / answer,
    seeded per question and step by `candidate_seed`; the default), "search", "answer" (always), or
    "heuristic": the previous step's action while the episode goes on — search at step 0, where
    nothing has been retrieved, and after an invalid step the last valid one — i.e. search on every
    step before the last (an episode only goes on after a search or an invalid step). At the last
    step every strategy's candidate is answer (the answer is forced), so here "heuristic" proposes
    what "search" does. `stop_at_fixed_point`: the shared rule on the memory and the step count (the
    prompt shows the count), which cannot fire.

    `think_prefix` (off by default, the paper's agent) starts the reply of every step but the forced
    last one with `<think>`, an assistant prefix the model continues, as the forced step starts with
    `<answer>`: the R1-style opening (DeepSeek-R1's chat template ends its generation prompt with
    `<think>`; the step prompt already demands the reasoning inside that tag). Ours, for small
    instruction models: the untrained Qwen2.5-Coder-0.5B answers the step prompt by echoing the
    candidate line ("SEARCH (call the search engine with ...)"), no tag and no action, so every
    non-forced step is invalid and the forced answer a sentence; opened inside `<think>`, it closes
    the tag and writes `<answer>` or `<search>` (docs/notes/2026-12-04-training-that-learns-on-the-cpu.md,
    measures what it changes). The prefix is prompt, not generation: training gives it no gradient.

    `belief_table` (a file; empty: off) replaces the probe by a belief read from the table, at the first
    step only: b = 2p − 1 for the probability p that the starting model's closed-book answer is right,
    as a linear probe on its hidden states puts it, out of fold (`scripts/belief-table --linear`), or
    b = 2a − 1 for the question's agreement a among K sampled closed-book answers (`scripts/belief-table`
    from `eval --samples K` runs). Ours, because the paper's probe carries no signal at 1.5B (AUROC 0.55
    against closed-book correctness; agreement 0.72, the linear probe 0.85: docs/report.md §4). The
    first step is where "do I know the answer?" is a question of the model's own knowledge, which both
    tables measure; after a search the question is whether the evidence suffices, which they do not,
    so later steps get no belief (and the consistency reward reads the first step alone). A frozen
    table also stays put while the policy trains.
    """

    T: int = setting(4, ge=1)
    k: int = setting(3, ge=1)
    step_max_tokens: int = setting(512, ge=1)
    verify_first: bool = True
    candidates: Literal["random", "search", "answer", "heuristic"] = "random"
    candidate_seed: int = setting(0, ge=0)
    probe: bool = False
    stop_at_fixed_point: bool = True
    # left out of the run id at its default, so the runs before it keep theirs
    think_prefix: bool = field(default=False, metadata={"omit_default": True})
    belief_table: str = field(default="", metadata={"omit_default": True})

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.belief_table:
            read_belief_table(self.belief_table)  # a missing or malformed table fails before any question


def read_belief_table(path: str) -> dict[str, float]:
    """A belief table: JSON lines {"question_id" (or "id"), and "p_right" or "agreement" in [0, 1]};
    question id -> b = 2x - 1. `p_right`: the linear probe's out-of-fold probability that the starting
    model's closed-book answer is right (`scripts/belief-table --linear`); `agreement`: the share of K
    sampled closed-book answers equal to the greedy one. A missing file or a bad line is an error naming
    the file and line."""
    import json
    from pathlib import Path

    from metarag.errors import ConfigError

    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"belief_table {path!r} is not a file (write one with scripts/belief-table)")
    table: dict[str, float] = {}
    for n, line in enumerate(file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            key = "p_right" if "p_right" in record else "agreement"
            qid, value = str(record.get("question_id", record.get("id"))), float(record[key])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DataError(f"line {n}: not a belief record {{question_id, p_right or agreement}} ({exc})",
                            path=str(file)) from None
        if not 0.0 <= value <= 1.0:
            raise DataError(f"line {n}: {key} {value} is outside [0, 1]", path=str(file))
        table[qid] = 2.0 * value - 1.0
    return table


# -------------------------------------------------------------------------------------- agents
@dataclass(frozen=True)
class _Step:
    """What one step's reply came to."""

    action: str  # "search" | "answer" | "invalid"
    content: str  # the query or the answer ("" when invalid)
    reason: str  # why invalid ("" otherwise)
    reply: str  # the reply with its closing tag restored


class _Episode:
    """One question's episode: the step loop both agents share, over the history one episode keeps
    (a new episode per question, so one method serves many questions in flight in `run_many`).
    Each agent's episode says how its prompts and its history are built."""

    def __init__(self, settings: SearchR1Settings | BeliefAgentSettings):
        self.settings = settings

    def policy(self, question: Question) -> Policy:
        s = self.settings
        self._start(question)
        states: list[Hashable] = []
        t = 0
        while t < s.T:
            forced = t == s.T - 1
            if not forced and s.stop_at_fixed_point:
                states.append(self._state(t))
                fixed = yield LoopState(states[-1], t, s.T - 2)
                if fixed is not None:  # the full loop would reach the last step from the state after ends_as
                    self._restore(states[fixed.ends_as + 1])  # ends_as < t: that state is on the list
                    t = s.T - 1
                    continue
            table = self._belief_table()
            if table is not None:
                if t == 0:  # the table's belief is the question's, read at the first step alone
                    if question.id not in table:
                        raise DataError(f"question {question.id!r} is not in the belief table "
                                        f"{getattr(s, 'belief_table', '')!r}")
                    b = table[question.id]
                    yield Note("belief", "yes" if b >= 0 else "no", (("step", 0.0), ("b", b), ("table", 1.0)))
            elif s.probe:
                belief = yield from belief_probe(self._context(question, t))
                signals = (("step", float(t)), ("b", belief.b)) + ((("fallback", 1.0),) if belief.fallback else ())
                yield Note("belief", "yes" if belief.answerable else "no", signals)
            candidate = yield from self._candidate(question, t, forced)
            out = yield Ask("agent-step", self._prompt(question, t, forced, candidate),
                            Decoding(max_tokens=s.step_max_tokens, stop=STOP, logprobs=1))
            step = self._read(out, forced)
            signals = (("step", float(t)), ("forced", float(forced)))
            if candidate is not None:
                signals += (("verified", float(step.action == candidate)),)
            yield Note("agent-step", step.action, signals)
            if step.action == "answer":
                return step.content
            if forced:  # the forced answer was empty
                return ""
            hits: list[Hit] = []
            if step.action == "search":
                hits = list((yield Search(step.content, s.k)))
            yield from self._remember(t, step, hits)
            t += 1
        return ""

    def _read(self, out: Completion, forced: bool) -> _Step:
        if forced:  # the reply started inside <answer>: it is the answer up to the stop (or its end)
            reply = FORCE_PREFIX + closed_reply(out)
            if out.finish_reason == "stop" and out.stop == "</search>":
                return _Step("invalid", "", "no answer", reply)
            answer = clean_answer(out.text)
            return _Step("answer", answer, "", reply) if answer else _Step("invalid", "", "empty answer", reply)
        reply = self._opening() + closed_reply(out)
        action, content, reason = read_agent_action(reply)
        if action == "answer":
            content = clean_answer(content) or content
        return _Step(action, content, reason, reply)

    def _belief_table(self) -> dict[str, float] | None:
        """The belief table of the settings (read once per process and path), None without one."""
        path = getattr(self.settings, "belief_table", "")
        return _cached_table(path) if path else None

    def _candidate(self, question: Question, t: int, forced: bool) -> Generator[Any, Any, str | None]:
        return None
        yield  # a generator that yields nothing: search-r1 proposes no candidate

    def _opening(self) -> str:
        """What a non-forced step's reply starts with, given as an assistant prefix (nothing: the
        model writes the whole reply)."""
        return ""

    # each agent's own
    def _start(self, question: Question) -> None: ...
    def _state(self, t: int) -> Hashable: ...
    def _restore(self, state: Hashable) -> None: ...
    def _context(self, question: Question, t: int) -> str: ...
    def _prompt(self, question: Question, t: int, forced: bool, candidate: str | None) -> tuple[Message, ...]: ...
    def _remember(self, t: int, step: _Step, hits: list[Hit]) -> Generator[Any, Any, None]: ...


@functools.lru_cache(maxsize=8)
def _cached_table(path: str) -> dict[str, float]:
    return read_belief_table(path)


class SearchR1:
    """Search-R1: one growing assistant turn, continued after each `<information>` block."""

    name = "search-r1"
    revision = 1

    def __init__(self, settings: SearchR1Settings = SearchR1Settings()):
        self.settings = settings

    def policy(self, question: Question) -> Policy:
        return _SearchR1Episode(self.settings).policy(question)


class _SearchR1Episode(_Episode):
    transcript = ""

    def _start(self, question: Question) -> None:
        self.transcript = ""

    def _state(self, t: int) -> Hashable:
        return self.transcript

    def _restore(self, state: Hashable) -> None:
        self.transcript = str(state)

    def _context(self, question: Question, t: int) -> str:
        context = SEARCH_R1_PROBE_CONTEXT.format(question=question.text)
        if self.transcript.strip():
            context += SEARCH_R1_PROBE_HISTORY.format(transcript=self.transcript.strip())
        return context

    def _prompt(self, question: Question, t: int, forced: bool, candidate: str | None) -> tuple[Message, ...]:
        user = Message("user", SEARCH_R1_INSTRUCTION.format(question=question.text))
        turn = self.transcript + (FORCE_NOTE + FORCE_PREFIX if forced else "")
        return (user, Message("assistant", turn)) if turn else (user,)

    def _remember(self, t: int, step: _Step, hits: list[Hit]) -> Generator[Any, Any, None]:
        if step.action == "search":
            observation = INFORMATION_BLOCK.format(passages=format_information(hits))
            if self.settings.max_obs_tokens:
                observation = yield Clip("information", observation, self.settings.max_obs_tokens)
            self.transcript += step.reply + observation
        else:
            self.transcript += step.reply + INVALID_NOTE


class BeliefAgent:
    """The paper's agent: a fresh step prompt from the question and the memory of earlier steps, and
    verify-first action generation."""

    name = "belief-agent"
    revision = 1

    def __init__(self, settings: BeliefAgentSettings = BeliefAgentSettings()):
        self.settings = settings

    def policy(self, question: Question) -> Policy:
        return _BeliefEpisode(self.settings).policy(question)


class _BeliefEpisode(_Episode):
    settings: BeliefAgentSettings
    memory: tuple[str, ...] = ()
    previous = "search"  # the heuristic's candidate: the last valid non-terminal action

    def _start(self, question: Question) -> None:
        self.memory, self.previous = (), "search"

    def _state(self, t: int) -> Hashable:
        return self.memory, t

    def _restore(self, state: Hashable) -> None:
        self.memory = state[0]  # type: ignore[index]

    def _context(self, question: Question, t: int) -> str:
        if not self.memory:
            return STEP_CONTEXT_FIRST.format(task_description=question.text)
        return STEP_CONTEXT.format(task_description=question.text, step_count=t,
                                   memory_context="\n".join(self.memory))

    def _candidate(self, question: Question, t: int, forced: bool) -> Generator[Any, Any, str | None]:
        s = self.settings
        if not s.verify_first:
            return None
        if forced:
            candidate = "answer"  # the last step can only answer: every strategy switches to it
        elif s.candidates == "random":
            candidate = random_candidate(s.candidate_seed, question.id, t)
        elif s.candidates == "heuristic":
            candidate = self.previous
        else:
            candidate = s.candidates
        yield Note("agent-candidate", candidate, (("step", float(t)),))
        return candidate

    def _prompt(self, question: Question, t: int, forced: bool, candidate: str | None) -> tuple[Message, ...]:
        context = self._context(question, t)
        if forced:
            return Message("user", context + LAST_STEP), Message("assistant", FORCE_PREFIX)
        body = context + STEP_ACTION
        if candidate is not None:
            body += "\n" + VERIFY_INSTRUCTION.format(candidate_decision=CANDIDATE_DECISION[candidate]) + "\n"
        opening = self._opening()
        return (Message("user", body),) + ((Message("assistant", opening),) if opening else ())

    def _opening(self) -> str:
        return THINK_PREFIX if self.settings.think_prefix else ""

    def _remember(self, t: int, step: _Step, hits: list[Hit]) -> Generator[Any, Any, None]:
        yield from ()
        if step.action == "search":
            self.previous = "search"
            self.memory += (MEMORY_SEARCH.format(n=t + 1, query=step.content, passages=format_information(hits)),)
        else:
            self.memory += (MEMORY_INVALID.format(n=t + 1, reason=step.reason),)
