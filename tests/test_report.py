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
