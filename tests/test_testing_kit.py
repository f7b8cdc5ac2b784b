"""`metarag.testing`, the public kit for testing a method without a model: the scripted LLM from code
and from a script file (`--llm scripted:FILE` through the CLI and experiment files), the in-memory
retriever and the fake OpenAI-compatible server."""
import json

import pytest

import metarag
from metarag.errors import ConfigError


def test_the_kit_is_public_and_importable_without_the_test_folder():
    from metarag import testing

    names = {"ScriptedLLM", "ScriptedTokens", "MemoryRetriever", "FakeOpenAIServer", "load_script"}
    assert names <= set(testing.__all__)
    llm = testing.ScriptedLLM([("capital", ["Paris", "Rome"])], default="?")
    assert [llm.complete("the capital").text for _ in range(3)] == ["Paris", "Rome", "Rome"]
    assert llm.complete("other").text == "?"


def test_a_script_file_runs_a_method_end_to_end_from_the_cli(tmp_path, capsys):
    from metarag.cli import main

    script = tmp_path / "rules.toml"
    script.write_text('name = "paris"\ndefault = "no idea"\n[[rules]]\npattern = "Question:"\nresponses = ["yes"]\n')
    code = main(["eval", "--method", "closed-book", "--dataset", "demo", "--limit", "3", "--seed", "1",
                 "--llm", f"scripted:{script}", "--runs-dir", str(tmp_path / "runs"), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0 and "| closed-book |" in out
    folder = next((tmp_path / "runs").iterdir())
    assert folder.name.startswith("closed-book-demo-scripted-")
    results = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in results] == ["yes"] * 3
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["model_identity"].startswith("scripted:paris:")  # names the file's content
    # another script under the same path is another model: another run folder
    script.write_text('[[rules]]\npattern = "Question:"\nresponses = ["no"]\n')
    main(["eval", "--method", "closed-book", "--dataset", "demo", "--limit", "3", "--seed", "1",
          "--llm", f"scripted:{script}", "--runs-dir", str(tmp_path / "runs"), "--quiet"])
    assert len(list((tmp_path / "runs").iterdir())) == 2


def test_bad_script_files_and_specs_fail_in_one_line(tmp_path):
    from metarag.testing import load_script

    with pytest.raises(ConfigError, match="--llm scripted:FILE"):
        metarag.run("closed-book", "demo", llm="scripted", limit=1)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rules": [{"pattern": "x"}]}))
    with pytest.raises(ConfigError, match=r"rules\[0\] needs a pattern and responses"):
        load_script(str(bad))
    bad.write_text(json.dumps({"rulez": []}))
    with pytest.raises(ConfigError, match="unknown field 'rulez'"):
        load_script(str(bad))
    with pytest.raises(ConfigError, match="script file .*missing"):
        load_script(str(tmp_path / "missing.json"))
    bad.write_text(json.dumps({"labels": [{"pattern": "x", "probs": {"Yes": 2}}]}))
    with pytest.raises(ConfigError, match=r"labels\[0\] needs a pattern and probs"):
        load_script(str(bad))


def test_label_rules_from_a_file_answer_yes_no_probes(tmp_path):
    from metarag.llm.scripted import ScriptSettings
    from metarag.testing import ScriptFileLLM

    script = tmp_path / "rules.json"
    script.write_text(json.dumps({"labels": [{"pattern": "sufficient", "probs": {"Yes": 0.8, "No": 0.2}}],
                                  "default": "x"}))
    llm = ScriptFileLLM(ScriptSettings(path=str(script)))
    assert llm.score_labels("Is it sufficient?", ("Yes", "No")).probs == (0.8, 0.2)


def test_a_method_of_your_own_gets_its_ranges_checked_with_the_public_setting(tmp_path, monkeypatch):
    from dataclasses import dataclass

    from metarag.methods import registry

    monkeypatch.setattr(registry, "_REGISTERED", dict(registry._REGISTERED))  # registered for this test only

    from metarag.policy.actions import Ask
    from metarag.records import Message
    from metarag.settings import check_ranges, setting
    from metarag.testing import ScriptedLLM

    @dataclass(frozen=True)
    class EchoSettings:
        k: int = setting(2, ge=1)

        def __post_init__(self) -> None:
            check_ranges(self)

    class Echo:
        name = "echo-mine"
        settings_class = EchoSettings

        def __init__(self, settings: EchoSettings = EchoSettings()):
            self.settings = settings

        def policy(self, question):
            out = yield Ask("answer", (Message("user", f"Question: {question.text}"),))
            return out.text

    metarag.register_method("echo-mine", Echo)
    llm = ScriptedLLM([("Question:", "Paris")])
    with pytest.raises(ConfigError, match="'k' must be >= 1, got 0"):
        metarag.run("echo-mine", "demo", limit=1, settings={"k": 0}, llm_instance=llm, runs_dir=tmp_path)
    run = metarag.run("echo-mine", "demo", limit=1, llm_instance=llm, runs_dir=tmp_path)
    assert [r.prediction for r in run.records] == ["Paris"]
