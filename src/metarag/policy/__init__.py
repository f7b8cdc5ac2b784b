"""The vocabulary a method's policy speaks, below `methods/` so that judges, rerankers, evaluation and
training share it without climbing a floor: the actions a policy yields (`actions.py`), the evidence
it shows (`evidence.py`), and the search agents' trace contract read as decision steps
(`agent_trace.py`)."""
