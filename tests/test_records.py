from metarag.records import (
    Answer,
    Decide,
    Generate,
    Hit,
    Judge,
    Message,
    Passage,
    Retrieve,
    Score,
    TokenLogprob,
    Trace,
    Usage,
)


def make_trace() -> Trace:
    hit = Hit(Passage("p1", "T", "text é"), 1.25, "bm25")
    steps = (
        Retrieve(Usage(latency_s=0.5, retrieval_calls=1), "who?", 5, (hit,)),
        Generate(Usage(10, 2, 4, 0.25, 1), "answer", (Message("system", "s"), Message("user", "u")), "Paris",
                 (TokenLogprob("Paris", -0.1, (("Paris", -0.1), ("Lyon", -3.0))),)),
        Score(Usage(7, 0, 0, 0.125, 1), "probe", (Message("raw", "x"),), ("Yes", "No"), (0.75, 0.25)),
        Judge(Usage(), "nli", "entailed", 0.9, {"premise_tokens": 12}, "ok"),
        Decide(Usage(), "action", "RETRIEVE", {"margin": 0.2}),
        Answer(Usage(), "Paris"),
    )
    return Trace("q1", "who?", "standard-rag", steps, answer="Paris")


def test_trace_round_trips_through_json_losslessly():
    trace = make_trace()
    again = Trace.from_json(trace.to_json())
    assert again == trace
    assert [type(s) for s in again.steps] == [type(s) for s in trace.steps]
    assert isinstance(again.steps[0].hits, tuple) and again.steps[0].hits[0].passage.text == "text é"


def test_trace_usage_is_the_sum_of_step_usage():
    usage = make_trace().usage
    assert usage.prompt_tokens == 17 and usage.completion_tokens == 2 and usage.cached_tokens == 4
    assert usage.llm_requests == 2 and usage.retrieval_calls == 1
    assert abs(usage.latency_s - 0.875) < 1e-12


def test_failed_trace_round_trips_with_its_error():
    trace = Trace("q2", "?", "cot", (), error="BackendError: down")
    assert Trace.from_json(trace.to_json()) == trace


def test_display_says_how_much_of_a_step_came_from_the_response_cache():
    from metarag.display import format_usage

    assert format_usage(Usage(latency_s=0.01, llm_requests=1, cache_hits=1)).endswith("from response cache")
    partly = format_usage(Usage(latency_s=2.0, prompt_tokens=900, llm_requests=10, cache_hits=3))
    assert partly.endswith("3 of 10 requests from response cache")
    assert "cache" not in format_usage(Usage(latency_s=2.0, prompt_tokens=90, llm_requests=1))
