"""judges stage of metarag."""
