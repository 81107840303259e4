"""Benchmarks and experiments: each module is a script (``python -m agent_rl.benchmarks.<name>``) that writes
JSON results, by default under ``benchmarks/results``; ``agent-rl bench`` runs the ones named in
``agent_rl.cli.BENCHMARKS``."""
