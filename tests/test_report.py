"""The report's table: rows of one method told apart by their settings."""


def test_rows_of_one_method_name_the_settings_they_differ_in_an_older_run_reading_as_the_default():
    from types import SimpleNamespace

    from metarag.evaluate.report import tell_apart

    def run(method, **values):
        return SimpleNamespace(settings={"method": method, "method_settings": values})

    # the first run predates the thresholds: it ran at their default, 0.5
    runs = [run("metarag", k=5), run("metarag", k=5, internal_threshold=0.6, external_threshold=0.5),
            run("no-such-method", k=1), run("no-such-method", k=1, extra=2), run("standard-rag", k=5)]
    rows = [{"method": r.settings["method"]} for r in runs]
    tell_apart(rows, runs)
    assert [r["method"] for r in rows] == ["metarag (internal_threshold=0.5)", "metarag (internal_threshold=0.6)",
                                           "no-such-method (extra=–)", "no-such-method (extra=2)", "standard-rag"]


def test_adaptive_rag_rows_name_the_router_that_routed_them():
    from metarag.evaluate.report import method_label

    assert method_label({"method": "adaptive-rag", "method_settings": {"classifier": "llm", "route": "auto"}}) == \
        "adaptive-rag (LLM classifier)"
    assert method_label({"method": "adaptive-rag",
                         "method_settings": {"classifier": "/x/routers/hotpot", "route": "auto"}}) == \
        "adaptive-rag (router hotpot)"
    assert method_label({"method": "adaptive-rag", "method_settings": {"classifier": "llm", "route": "B"}}) == \
        "adaptive-rag (route B)"
    assert method_label({"method": "ircot", "method_settings": {"k": 6}}) == "ircot"


def test_rows_of_two_revisions_name_the_revision_and_the_older_ones_settings_are_not_read_as_todays():
    from types import SimpleNamespace

    from metarag.evaluate.report import tell_apart

    old = SimpleNamespace(settings={"method": "dragin", "method_settings": {"k": 3}})
    new = SimpleNamespace(settings={"method": "dragin", "method_settings": {"k": 3, "force_answer": True},
                                    "method_revision": 2})
    rows = [{"method": "dragin"}, {"method": "dragin"}]
    tell_apart(rows, [old, new])
    assert [r["method"] for r in rows] == ["dragin (force_answer=–, rev=1)", "dragin (force_answer=True, rev=2)"]


def test_the_answers_a_change_moved_are_counted_each_way():
    from types import SimpleNamespace

    from metarag.evaluate.report import answer_changes

    def result(qid, prediction, em):
        return SimpleNamespace(question_id=qid, prediction=prediction, scores=SimpleNamespace(em=em))

    base = SimpleNamespace(name="old", results=(result("a", "Paris", 1.0), result("b", "the answer is Rome", 0.0),
                                                result("c", "Oslo", 0.0), result("d", "x", 1.0)))
    run = SimpleNamespace(name="new", results=(result("a", "Paris", 1.0), result("b", "Rome", 1.0),
                                               result("c", "Bergen", 0.0), result("d", "y", 0.0)))
    table = answer_changes([base, run])
    assert "| new | 4 | 3 | 1 | 1 | +0.00 |" in table
