"""evaluate stage of metarag."""
