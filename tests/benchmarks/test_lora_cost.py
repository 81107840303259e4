"""The LoRA cost benchmark in quick mode (embedded policy, one arm per process): its accounting."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("peft", reason="peft (the lora extra) is not installed")

from agent_rl.benchmarks import lora_cost  # noqa: E402


@pytest.mark.slow
def test_quick_run_accounts_for_what_lora_trains_and_saves(tmp_path):
    path = lora_cost.main(["--quick", "--ranks", "2", "--out", str(tmp_path)])
    result = json.loads(path.read_text())
    full, lora = result["arms"]
    assert (full["lora_rank"], lora["lora_rank"]) == (0, 2)
    assert full["trained_parameters"] == full["parameters"]
    # Rank 2 on the embedded model's 7 linear layers per block (hidden 256, key/value 128, MLP 512),
    # 4 blocks: 2 x (512 + 2 x 384 + 512 + 2 x 768 + 768) x 4.
    assert lora["trained_parameters"] == 32_768
    assert lora["parameters"] == full["parameters"] + lora["trained_parameters"]  # the adapters are added
    for arm in (full, lora):  # float32 gradient + AdamW's two moments
        assert arm["gradient_and_adamw_bytes"] == 12 * arm["trained_parameters"]
        assert arm["update_seconds"] > 0 and arm["forwarded_tokens_per_update"] > 0
        assert arm["optimizer_steps_per_update"] == 2  # the recipe's minibatches
    assert lora["forwarded_tokens_per_update"] == full["forwarded_tokens_per_update"]  # the same batch
    assert lora["checkpoint_model_bytes"] < 0.1 * full["checkpoint_model_bytes"]
    assert lora["checkpoint_optimizer_bytes"] < 0.1 * full["checkpoint_optimizer_bytes"]
    assert lora["relative_to_full"]["trained_parameters"] == lora["trained_parameters"] / full["trained_parameters"]
