"""The fake OpenAI-compatible server lives in the package (`metarag.testing.FakeOpenAIServer`); this
name stays for the tests that import it and for running it by hand:

    python tests/fake_openai.py --port 8011 [--answer Paris] [--mode ok|hang|error|...] [--delay SECONDS]
"""
from metarag.testing.fake_openai import FakeOpenAIServer, main

__all__ = ["FakeOpenAIServer", "main"]

if __name__ == "__main__":
    main()
