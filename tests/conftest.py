"""Shared fixtures: a small hand-made corpus, a scripted LLM, and an isolated METARAG_HOME."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from metarag.records import Passage

try:  # property tests check behaviour, not speed: no per-example deadline on a loaded machine
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("metarag", deadline=None)
    _hypothesis_settings.load_profile("metarag")
except ImportError:  # hypothesis is a test extra; the modules that use it skip without it
    pass

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

# Seven short passages with known BM25 / dense behaviour, for the retrieval and service tests.
CITIES = [Passage(*fields) for fields in [
    ("p1", "Paris", "Paris is the capital and largest city of France."),
    ("p2", "Berlin", "Berlin is the capital of Germany."),
    ("p3", "Lyon", "Lyon is a city in France, known for its cuisine."),
    ("p4", "Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris."),
    ("p5", "Rhine", "The Rhine flows through Switzerland, Germany and the Netherlands."),
    ("p6", "Louvre", "The Louvre is an art museum in Paris."),
    ("p7", "Mars", "Mars is the fourth planet from the Sun."),
]]

CORPUS = [
    Passage("p1", "Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris, France."),
    Passage("p2", "Gustave Eiffel", "Gustave Eiffel was a French civil engineer born in Dijon in 1832."),
    Passage("p3", "Dijon", "Dijon is a city in eastern France, capital of the Cote-d'Or department."),
    Passage("p4", "Statue of Liberty", "The Statue of Liberty is on Liberty Island in New York Harbor."),
    Passage("p5", "Mustard", "Dijon mustard originated in 1856 when Jean Naigeon of Dijon changed the recipe."),
]


def pytest_collection_modifyitems(config, items):
    """An embedded-model or server test loads a real model: mark it `real_model`, so that `make test-fast`
    (-m "not real_model and not browser") leaves it out without a second marker on each."""
    for item in items:
        if item.get_closest_marker("embedded") or item.get_closest_marker("server"):
            item.add_marker(pytest.mark.real_model)


def pytest_addoption(parser):
    parser.addoption("--screenshot-dir", default=None,
                     help="also save the viewer's browser-test screenshots here (tests/test_view_browser.py)")


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """Every test writes caches and indexes under its own temporary METARAG_HOME, except the
    embedded-model tests, which reuse the assembled GGUF from the real home through a symlink."""
    home = tmp_path / "metarag_home"
    home.mkdir()
    real_models = Path.home() / ".cache" / "metarag" / "models"
    import os

    real_home = os.environ.get("METARAG_HOME")
    if real_home:
        real_models = Path(real_home) / "models"
    if real_models.is_dir():
        (home / "models").symlink_to(real_models)
    monkeypatch.setenv("METARAG_HOME", str(home))
    return home


@pytest.fixture
def corpus() -> list[Passage]:
    return list(CORPUS)


@pytest.fixture(scope="session")
def sample20():
    """The 20 questions `--limit 20 --seed 0` picks from hotpotqa-dev500 and a retriever over their
    paragraphs, or from the shipped demo set where the data folder is absent (a fresh clone's CI)."""
    from metarag.data.datasets import resolve_preset, sample
    from metarag.retrieve.memory import MemoryRetriever

    if (SHARED_DATA / "hotpotqa" / "dev500_ircot.jsonl").is_file():
        data = resolve_preset("hotpotqa-dev500", SHARED_DATA)
    else:
        data = resolve_preset("demo")
    data = sample(data, 20, 0)
    return list(data.questions), MemoryRetriever(list(data.passages))


@pytest.fixture
def notes(caplog):
    """The library's notes and warnings (its `metarag.*` log lines at INFO and above: an index built and
    why, a run resumed or waiting) since the last call, as the CLI shows them on stderr."""
    caplog.set_level(logging.INFO, logger="metarag")

    def read() -> str:
        text = "".join(f"{record.getMessage()}\n" for record in caplog.records)
        caplog.clear()
        return text

    return read
