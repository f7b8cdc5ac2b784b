"""data stage of metarag."""
