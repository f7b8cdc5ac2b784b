"""methods stage of metarag."""
