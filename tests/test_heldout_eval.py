"""`scripts/heldout-eval --reference`: the claim that one trained checkpoint beats the others on the held-out
questions (issue 51: the belief reward's run against the outcome reward's), on scripted run folders."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from test_rewards import step_steps, trace_of
from test_under_search import renamed, write_run

from metarag.policy.agent_trace import ANSWER, SEARCH

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "heldout-eval"


def heldout_eval():
    loader = importlib.machinery.SourceFileLoader("heldout_eval", str(SCRIPT))
    spec = importlib.util.spec_from_loader("heldout_eval", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def agent_run(folder: Path, right: set[int], searching: set[int], n: int = 40):
    """A belief-agent run over q0..q{n-1}: right ("Paris") on `right`, one search before its answer on
    `searching`."""
    traces = {}
    for i in range(n):
        answer = "Paris" if i in right else "Rome"
        steps = ((step_steps(0, SEARCH, belief=0.0), step_steps(1, ANSWER, belief=0.0)) if i in searching
                 else (step_steps(0, ANSWER, belief=0.0),))
        traces[f"q{i}"] = renamed(trace_of(*steps, answer=answer), f"q{i}")
    return write_run(folder, traces)


def test_the_reference_checkpoint_is_tested_against_the_others(tmp_path, capsys):
    untrained = agent_run(tmp_path / "u", set(range(8)), set(range(40)))
    outcome = agent_run(tmp_path / "o", set(range(10)), set())                  # never searches
    belief = agent_run(tmp_path / "b", set(range(30)), set(range(20, 40)))     # searches where the book is wrong
    book = write_run(tmp_path / "cb", {f"q{i}": renamed(trace_of(answer="Paris" if i < 20 else "Rome"), f"q{i}")
                                       for i in range(40)}, method="closed-book")
    runs = [SimpleNamespace(path=r.path) for r in (untrained, outcome, belief)]
    checkpoints = ["x/pool-outcome/trainer/checkpoint-100", "x/pool-belief/trainer/checkpoint-100"]
    heldout_eval().claim("headline-2wiki", runs, checkpoints, checkpoints[1], str(book.path))
    out = capsys.readouterr().out
    assert "## headline-2wiki: pool-belief/checkpoint-100 against the others (the claim)" in out
    assert "untrained = u; pool-outcome/checkpoint-100 = o; pool-belief/checkpoint-100 = b" in out
    assert "Against b, on the same questions" in out                    # the table's baseline is the reference
    assert "| belief-agent (scripted) [o] | 40 | 20 (0 / 20) | -50.0 |" in out   # its power table tells them apart
    # its searches lean toward the 20 questions the book gets wrong (gap +1.00); the outcome run's and the
    # untrained run's do not (0: never, and always)
    assert "| b | o | 20 | 20 | +1.00 | +0.00 | +1.00 |" in out and "| b | u | 20 | 20 | +1.00 | +0.00 | +1.00 |" in out
    # EM: belief right alone on 20 of 40 against the outcome run: reproduced; the untrained run is in the family
    assert "(EM; pool-belief/checkpoint-100 against the rows the paper claims it beats; Holm over the table's 2" in out
    assert "**reproduced**" in out and "- beats pool-outcome/checkpoint-100: Δ EM +50.0 points on 40 questions" in out


def test_the_reference_must_be_one_of_several_checkpoints():
    def refused(*args):
        done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
        return done.returncode, done.stderr

    code, err = refused("a/trainer/checkpoint-2", "--reference", "b/trainer/checkpoint-2")
    assert code == 2 and "--reference b/trainer/checkpoint-2 must be one of two or more CHECKPOINTs" in err
    code, err = refused("a/trainer/checkpoint-2", "--reference", "a/trainer/checkpoint-2")
    assert code == 2 and "must be one of two or more" in err
