"""The zero-shot benchmark's quick mode, on the embedded policy (the real model is not needed)."""

from __future__ import annotations

import json

from agent_rl.benchmarks import smollm2_zero_shot
from agent_rl.training.models.prompts import PromptFormat


def test_quick_mode_writes_every_parser_cell_with_consistent_rates_and_parses(tmp_path):
    path = smollm2_zero_shot.main(["--quick", "--policy", "embedded", "--engine", "hf", "--out", str(tmp_path)])
    result = json.loads(path.read_text())
    assert result["episodes"] == 2 and result["max_turns"] == 2 and result["engine"] == "hf"
    assert [(c["env"], c["parser"]) for c in result["cells"]] == [
        ("maze-small", "first_line"),
        ("maze-small", "action_tag"),
        ("maze-small", "admissible"),
    ]
    for cell in result["cells"]:
        assert cell["env_kwargs"]["n_rooms"] == 2
        for mode in ("greedy", "sampled"):
            stats = cell[mode]
            assert set(stats) == set(smollm2_zero_shot.REPORTED)
            assert 0 <= stats["success_rate"] <= 1 and 0 <= stats["invalid_action_rate"] <= 1
            assert 1 <= stats["mean_length"] <= 2
        for reply in cell["first_greedy_replies"]:
            # What is reported as played is what the cell's parser reads in the reply.
            fmt = PromptFormat(parser=cell["parser"])
            assert (reply["action"], reply["named"]) == fmt.parse(reply["reply"], reply["admissible"])
            assert reply["admissible"]  # the Maze lists its admissible actions
