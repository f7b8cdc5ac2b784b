"""train stage of metarag: rewards and trainers (SIM-RAG's self-practice and critic training)."""
