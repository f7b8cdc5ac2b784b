"""Test any method, ours or yours, with no model and no network: a scripted LLM, an in-memory
retriever and an OpenAI-compatible fake server (as DSPy's `DummyLM`).

    from metarag import run
    from metarag.testing import ScriptedLLM

    llm = ScriptedLLM([("Question:", "Paris")])          # every prompt holding "Question:" -> "Paris"
    table = run("standard-rag", "demo", limit=2, llm_instance=llm).table()

**The rule format.** `ScriptedLLM(rules, label_rules, default=None, name="scripted")`:

- `rules`: (pattern, responses) pairs, tried in order; a rule answers a prompt when its regular
  expression is found in it (the prompt as rendered: `<system>\\n...\\n<user>\\n...\\n<assistant>\\n`
  for chat messages). Its responses are used one per call, the last repeating. A response is a
  string, a function of the prompt, or `ScriptedTokens.of("The", (" Lyon", -4.0))` (pieces with
  their log-probabilities, for methods that read token probabilities such as FLARE or DRAGIN).
- `label_rules`: (pattern, {label: probability}) pairs for `score_labels` (yes/no judges and
  probes); without a matching one, the generation rules answer as the model would.
- `default`: the answer to a prompt no rule matches (without it such a prompt is an error naming it).
- Tokens are whitespace-delimited words, so token counts are word counts, checkable by hand.

The same rules in a file (TOML or JSON; `load_script` documents it) run from the command line and
from experiment files: `metarag eval --llm scripted:rules.toml ...`, `llm = "scripted:rules.toml"`.

`MemoryRetriever(passages)` ranks exactly as the BM25 index does, in memory. `FakeOpenAIServer`
answers `/v1/models` and the completion endpoints on loopback, and can hang or fail on purpose
(`mode`), for testing a client's timeouts and retries: `with FakeOpenAIServer(answer="Paris") as s:
... --llm openai:fake@{s.url}`.
"""
from metarag.llm.scripted import ScriptedLLM, ScriptedTokens, ScriptFileLLM, load_script
from metarag.retrieve.memory import MemoryRetriever
from metarag.testing.fake_openai import FakeOpenAIServer

__all__ = ["FakeOpenAIServer", "MemoryRetriever", "ScriptFileLLM", "ScriptedLLM", "ScriptedTokens", "load_script"]
