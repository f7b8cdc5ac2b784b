"""`import metarag` and the CLI's start-up pull nothing heavy: back-ends load only when used."""
import subprocess
import sys

HEAVY = ("torch", "llama_cpp", "sentence_transformers", "faiss", "bm25s", "openai", "transformers",
         "scipy", "matplotlib")


def loaded_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True).stdout.split()
    return {name.split(".")[0] for name in out}


def test_import_metarag_is_light():
    assert not loaded_after("import metarag") & set(HEAVY)


def test_cli_help_and_method_registry_are_light():
    code = ("import metarag.cli, metarag.pipeline, metarag.methods.registry as r, metarag.evaluate.harness\n"
            "metarag.cli.build_parser()\nr.build_method('standard-rag')")
    assert not loaded_after(code) & set(HEAVY)
