"""The policy drift measure (`metarag.train.drift`): exact KL of a LoRA-adapted policy from its
start model over an agent's replies, on a tiny model built from a config."""
from __future__ import annotations

import copy

import pytest

from metarag.errors import DataError
from metarag.policy.agent_trace import STEP_PURPOSE
from metarag.records import Generate, Message, TokenLogprob, Trace, Usage

pytest.importorskip("torch")
pytest.importorskip("peft")


def _trace(tokenizer, qid: str, replies: list[str]) -> Trace:
    steps = []
    for k, text in enumerate(replies):
        ids = tokenizer.encode(text, add_special_tokens=False)
        prompt = (Message("user", f"Question {qid}, step {k}: Who built the tower?"),)
        steps.append(Generate(Usage(), STEP_PURPOSE, prompt, text,
                              tuple(TokenLogprob(tokenizer.decode([i]), -1.0, id=i) for i in ids)))
    steps.append(Generate(Usage(), "belief-probe-note", (Message("user", "not a decision step"),), "Yes",
                          (TokenLogprob("Yes", -0.1, id=5),)))
    return Trace(qid, "Who built the tower?", "belief-agent", tuple(steps), answer=replies[-1])


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import sys
    from pathlib import Path

    import torch
    from peft import LoraConfig, get_peft_model

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_hf import tiny_llm, tiny_model_and_tokenizer

    base, tokenizer = tiny_model_and_tokenizer()
    folders = {}
    for name, std in (("zero", 0.0), ("moved", 0.05)):
        model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        torch.manual_seed(1)
        for pname, param in model.named_parameters():
            if "lora_B" in pname and std:
                torch.nn.init.normal_(param, std=std)
        folders[name] = tmp_path_factory.mktemp(name)
        model.save_pretrained(str(folders[name]))
    traces = [_trace(tokenizer, "q1", ["The answer is Paris.", "Gustave Eiffel"]),
              _trace(tokenizer, "q2", ["Dijon"])]
    return base, tokenizer, folders, traces, tiny_llm()


def test_replies_are_the_decision_steps_with_their_prompt_as_rendered(setup):
    from metarag.llm.base import prompt_text
    from metarag.train.drift import trace_replies

    _, tokenizer, _, traces, llm = setup
    replies = trace_replies(traces, llm)
    assert [r.question_id for r in replies] == ["q1", "q1", "q2"]  # the probe-like step is not one
    assert replies[0].reply_ids == tuple(tokenizer.encode("The answer is Paris.", add_special_tokens=False))
    assert replies[0].prompt_ids == tuple(llm.tokenize(prompt_text(llm, traces[0].steps[0].prompt)))


def test_zero_adapter_has_no_drift_and_a_moved_one_has_the_exact_kl(setup):
    import torch

    from metarag.train.drift import load_adapters, policy_drift, trace_replies

    base, _, folders, traces, llm = setup
    replies = trace_replies(traces, llm)
    model = load_adapters(copy.deepcopy(base), [("zero", str(folders["zero"])), ("moved", str(folders["moved"]))])
    zero, moved = policy_drift(model, ["zero", "moved"], replies)
    assert (zero.adapter, zero.replies, zero.tokens) == ("zero", 3, sum(len(r.reply_ids) for r in replies))
    assert zero.kl_per_token == pytest.approx(0.0, abs=1e-9) and zero.greedy_flips == 0
    assert zero.logprob_change == pytest.approx(0.0, abs=1e-6)
    assert moved.kl_per_token > 1e-6 and moved.kl_max >= moved.kl_per_token
    assert moved.kl_per_reply == pytest.approx(moved.kl_per_token * moved.tokens / moved.replies)

    # the same numbers from two separate models: the start model and the moved adapter merged into a copy
    from peft import PeftModel
    merged = PeftModel.from_pretrained(copy.deepcopy(base), str(folders["moved"])).merge_and_unload()
    total, taken = 0.0, 0.0
    with torch.no_grad():
        for r in replies:
            ids = torch.tensor([list(r.prompt_ids) + list(r.reply_ids)])
            n = len(r.reply_ids)
            p0 = torch.log_softmax(base(input_ids=ids).logits[0, -n - 1:-1], -1)
            p1 = torch.log_softmax(merged(input_ids=ids).logits[0, -n - 1:-1], -1)
            total += float((p1.exp() * (p1 - p0)).sum())
            target = torch.tensor(r.reply_ids)[:, None]
            taken += float((p1.gather(1, target) - p0.gather(1, target)).sum())
    assert moved.kl_per_token == pytest.approx(total / moved.tokens, rel=1e-3)
    assert moved.logprob_change == pytest.approx(taken / moved.replies, rel=1e-3, abs=1e-6)


def test_no_replies_and_replies_without_ids_are_refused(setup):
    from metarag.train.drift import policy_drift, trace_replies

    base, tokenizer, _, traces, llm = setup
    with pytest.raises(DataError, match="no replies"):
        policy_drift(base, ["x"], [])
    step = traces[1].steps[0]
    bad = Trace("q3", "?", "belief-agent", (Generate(Usage(), STEP_PURPOSE, step.prompt, "Dijon",
                                                     (TokenLogprob("Dijon", -1.0),)),))
    with pytest.raises(DataError, match="q3.*no token ids"):
        trace_replies([bad], llm)
