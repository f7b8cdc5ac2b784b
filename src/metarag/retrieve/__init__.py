"""Retrieval: the Retriever protocol and its back-ends (bm25, dense, memory), imported lazily."""
