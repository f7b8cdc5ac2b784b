"""Reflexion (Shinn et al., 2023, "Reflexion: language agents with verbal reinforcement learning",
§3 and §4.2, the HotpotQA ReAct setup of noahshinn/reflexion hotpotqa_runs): trials of a ReAct actor
over our retriever, an evaluator, and a self-reflection written into a memory the next trial reads.

One question, as a policy over the shared runner loop:

1. Trial t = 1..N: the actor is ReAct's own policy (`react.react_trial`, run as a sub-policy with
   the memory's reflections in its prompt), a fresh transcript each trial.
2. The evaluator labels the trial. `evaluator="self"` (default): the model's P("Yes") of the label
   pair ("Yes", "No") on "Is this answer correct and supported?" over the trial's transcript, correct
   at `threshold` or above; a probe with no mass on either label counts as incorrect (recorded).
   `evaluator="gold"`: exact match with the question's gold answers (the `judges.gold.GoldMatch`
   judge, a Judge step), the paper's HotpotQA evaluator (agents.py `is_correct`: EM) — oracle
   feedback, which a fair comparison cannot use; every report row of such a run says "(oracle
   feedback)". A trial that halted without Finish (step limit, context budget) is incorrect without
   asking, as in the paper's code.
3. Correct: its answer is final. Incorrect, with trials left: the model writes a reflection on the
   transcript (closed with "Observation n: Answer is INCORRECT", as the paper's scratchpad is),
   appended to the memory (the paper keeps every reflection for HotpotQA), and the next trial runs.
   After N trials judged incorrect, the last answer given is final (`final`; the paper scores the
   agent's last trial, which may have halted without one).

Every evaluation is a `reflexion-eval` Decide step ("correct" / "incorrect", with the trial, P(Yes)
or the EM, whether the feedback is the oracle's, whether the probe fell back, whether it halted).
Departures, on purpose: the reflection prompt has no exemplars (the paper's two reflection
exemplars carry whole failed trials, which a 1.5B model's context cannot hold next to a new one), and
the prompts are our own wording of the paper's.
"""
from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Literal

from metarag.errors import ConfigError
from metarag.judges.gold import GoldMatch
from metarag.llm.base import Decoding
from metarag.methods.fixed_point import LoopState
from metarag.methods.react import REACT_SYSTEM, AtStepLimit, ReActSettings, Trial, react_trial
from metarag.methods.runner import Policy
from metarag.policy.actions import Ask, Assess, Note, Probe
from metarag.records import Message, Question
from metarag.settings import check_ranges, setting

REFLECT_SYSTEM = "You are a careful assistant that learns from its mistakes."
REFLECT_TASK = (
    "Below is an earlier attempt to answer a question with a search tool over encyclopedia passages. The "
    "attempt failed: either its Finish answer was wrong, or it ran out of steps before finishing.\n"
    "In two or three sentences, say what most likely went wrong, then give a short plan for the next "
    "attempt that avoids the same mistake. Write complete sentences, no list.\n\n"
    "Question: {question}\n{transcript}\nReflection:")
FAILED = "Observation {step}: Answer is INCORRECT"  # how the paper's scratchpad ends a failed trial
HALTED = "(The attempt ran out of steps before it finished.)"
MEMORY_HEADER = ("Earlier attempts at the next question failed. Notes written after them, to avoid the same "
                 "mistakes:\n")
EVAL_TASK = ("Question: {question}\nAttempt:\n{transcript}\nProposed answer: {answer}\n"
             "Is this answer correct and supported? Answer Yes or No.")


@dataclass(frozen=True)
class ReflexionSettings:
    """Reflexion settings (Shinn et al., 2023, HotpotQA with a ReAct actor).

    trials = 5: the paper's HotpotQA ReAct runs (hotpotqa_runs/notebooks/ReactQA.ipynb, `n = 5`; its
    logs hold 5- and 7-trial runs). `evaluator`: "self" (default: the fair comparison) or "gold"
    (the paper's oracle). threshold = 0.5 on the self-evaluation's P("Yes") (the paper has no
    threshold: its evaluator is exact). The actor is ReAct's policy with Reflexion's agent: max_steps
    = 6 (agents.py `ReactAgent(max_steps=6)`, one fewer than ReAct's 7), and ReAct's defaults for k,
    step_max_tokens, at_step_limit ("empty": a halted trial has no answer) and max_prompt_tokens
    (3,896, the agent's own halting rule). reflect_max_tokens = 250 (the code's reflection model
    max_tokens). `stop_at_fixed_point`: the shared rule on the memory; it cannot fire as the loop
    stands, since every trial that goes on appends a reflection (it applies inside each ReAct trial
    too, on that trial's transcript). `final` is the answer when every trial is judged incorrect:
    "last-answered" (default), the last trial that finished with an answer — the paper scores the
    last trial, whose answer its oracle evaluator has just called wrong, so nothing is lost there,
    but with the self evaluator an earlier trial's answer may be right while a last trial that
    halted has none; "last": the last trial's answer, "" when it halted (before revision 2).
    """

    trials: int = setting(5, ge=1)
    evaluator: Literal["self", "gold"] = "self"
    threshold: float = setting(0.5, ge=0.0, le=1.0)
    k: int = setting(3, ge=1)
    max_steps: int = setting(6, ge=1)
    step_max_tokens: int = setting(100, ge=1)
    at_step_limit: AtStepLimit = "empty"
    max_prompt_tokens: int = setting(3896, ge=0)
    reflect_max_tokens: int = setting(250, ge=1)
    stop_at_fixed_point: bool = True
    final: Literal["last-answered", "last"] = "last-answered"

    def __post_init__(self) -> None:
        check_ranges(self)

    @property
    def actor(self) -> ReActSettings:
        """The ReAct settings of each trial."""
        return ReActSettings(k=self.k, max_steps=self.max_steps, step_max_tokens=self.step_max_tokens,
                             at_step_limit=self.at_step_limit, max_prompt_tokens=self.max_prompt_tokens,
                             stop_at_fixed_point=self.stop_at_fixed_point)


def format_memory(reflections: list[str]) -> str:
    """The reflections as the actor's prompt shows them before the question ("" for none)."""
    if not reflections:
        return ""
    return MEMORY_HEADER + "".join(f"- {r}\n" for r in reflections) + "\n"


def failed_transcript(trial: Trial) -> str:
    """The trial's transcript as the reflection reads it: closed the way the paper's scratchpad is."""
    if trial.finished:
        return trial.transcript + FAILED.format(step=trial.steps)
    return trial.transcript + HALTED


class Reflexion:
    """Reflexion as a policy: ReAct trials, an evaluator, reflections carried into the next trial."""

    name = "reflexion"
    revision = 2  # 2: after N incorrect trials, the last answered one's answer (final)
    components = ("react",)  # its actor is ReAct's trial

    def __init__(self, settings: ReflexionSettings = ReflexionSettings()):
        self.settings = settings

    def policy(self, question: Question) -> Policy:
        s = self.settings
        if s.evaluator == "gold" and not question.answers:
            raise ConfigError(f"reflexion evaluator=gold needs gold answers, and question {question.id!r} has none")
        reflections: list[str] = []
        trials: list[Trial] = []
        for t in range(s.trials):
            if s.stop_at_fixed_point:
                fixed = yield LoopState(("reflexion", tuple(reflections)), t, s.trials - 1)
                if fixed is not None:  # the full loop would end as trial `ends_as` did
                    return trials[fixed.ends_as].answer
            trial = yield from react_trial(question, s.actor, format_memory(reflections))
            trials.append(trial)
            correct = yield from self.evaluate(question, trial, t + 1)
            if correct:
                return trial.answer
            if t == s.trials - 1:
                return self.final_answer(trials)
            task = REFLECT_TASK.format(question=question.text, transcript=failed_transcript(trial))
            out = yield Ask("reflect", (Message("system", REFLECT_SYSTEM), Message("user", task)),
                            Decoding(max_tokens=s.reflect_max_tokens, stop=("\nQuestion:", "\nPrevious trial")))
            reflections.append(" ".join(out.text.split()))
        return trials[-1].answer  # not reached: the last trial returns

    def final_answer(self, trials: list[Trial]) -> str:
        """The answer after every trial was judged incorrect (see `ReflexionSettings.final`)."""
        if self.settings.final == "last-answered":
            answered = [t.answer for t in trials if t.finished and t.answer]
            if answered:
                return answered[-1]
        return trials[-1].answer

    def evaluate(self, question: Question, trial: Trial, number: int) -> Generator[Any, Any, bool]:
        """Whether `trial` is judged correct; records a `reflexion-eval` Decide step."""
        s = self.settings
        oracle = float(s.evaluator == "gold")
        signals: list[tuple[str, float]] = [("trial", float(number)), ("oracle", oracle)]
        if not trial.finished or not trial.answer:
            yield Note("reflexion-eval", "incorrect", (*signals, ("halted", float(not trial.finished))))
            return False
        if s.evaluator == "gold":
            verdict = yield Assess(GoldMatch(), {"answer": trial.answer, "gold": question.answers})
            yield Note("reflexion-eval", verdict.verdict, (*signals, ("em", float(verdict.score))))
            return verdict.verdict == "correct"
        task = EVAL_TASK.format(question=question.text, transcript=trial.transcript.rstrip("\n"), answer=trial.answer)
        scores = yield Probe("self-evaluate", (Message("system", REACT_SYSTEM), Message("user", task)))
        p_yes, fallback = scores.p("Yes")
        correct = fallback is None and p_yes >= s.threshold
        yield Note("reflexion-eval", "correct" if correct else "incorrect",
                   (*signals, ("p_yes", p_yes), ("fallback", float(fallback is not None))))
        return correct
