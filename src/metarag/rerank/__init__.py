"""Rerankers: reorder a retrieval's candidates after each retrieval round (pointwise or listwise)."""
