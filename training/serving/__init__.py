"""Generation and environments at scale: the hf and vLLM engines (and their Ray replicas),
environment factories and pools."""
