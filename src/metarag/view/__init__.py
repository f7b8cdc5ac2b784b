"""`metarag view`: a local web page over finished (or running) run folders, read-only.

`loading` reads run folders as `metarag report` does and says what is wrong with them instead of
failing; `server` is the FastAPI application and its JSON endpoints; `static/` holds the page.
"""
