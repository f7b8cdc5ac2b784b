"""The CLI front of the retrieval service and of critic training: `index build` keeps a corpus copy,
`serve-retriever` serves it, `--retriever remote:URL` reads from it."""
import json
import sys

import pytest
from conftest import SHARED_DATA
from servers import free_port, server_process

from metarag.cli import main
from metarag.pipeline import open_retriever
from metarag.records import Passage

pytest.importorskip("bm25s")


def test_index_build_then_serve_then_remote_search(tmp_path, capsys, corpus):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n" for p in corpus))
    index_dir = tmp_path / "index"
    assert main(["index", "build", "--corpus", str(path), "--retrievers", "bm25", "--index-dir", str(index_dir)]) == 0
    out, err = capsys.readouterr()
    # the library's note (a log line) reaches stderr as it read when it was printed
    assert "bm25: 5 passages" in out and f"metarag: building bm25 index in {index_dir / 'bm25'}" in err
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "metarag.cli", "serve-retriever", "--index", str(index_dir), "--port", str(port)]
    with server_process(argv, f"{url}/health"):
        remote = open_retriever([Passage("x", "", "unused")], f"remote:{url}")
        hits = remote.search("Where was Gustave Eiffel born?", 2, exclude={"p1"})
        assert [h.passage.id for h in hits][0] == "p2" and "p1" not in {h.passage.id for h in hits}


def test_unknown_retriever_name_is_refused_by_the_cli(capsys):
    with pytest.raises(SystemExit):
        main(["ask", "Who?", "--retriever", "elastic"])
    assert "unknown retriever 'elastic'" in capsys.readouterr().err


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="needs the shared benchmark data beside the repo")
def test_train_critic_refuses_an_evaluation_split(capsys, tmp_path):
    assert main(["train-critic", "--dataset", "hotpotqa-dev500", "--out", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("metarag: error:") and "train" in err
    assert not (tmp_path / "c" / "critic.npz").exists()
