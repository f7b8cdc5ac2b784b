"""llm stage of metarag."""
