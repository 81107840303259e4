"""LoRA adapters (policy.lora_rank > 0, peft): they start as the identity and are all that trains,
engines serve the merged weights, checkpoints hold the adapter alone and load as a merged policy, a
LoRA run trains only the targeted weights, and mismatches are clear errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft", reason="peft (the lora extra) is not installed")

from agent_rl.config import ConfigError, load_config  # noqa: E402
from agent_rl.training.infra import checkpoint  # noqa: E402
from agent_rl.training.models.policy import ADAPTER_CONFIG, add_lora, is_lora, load_policy, serving_state_dict  # noqa: E402
from agent_rl.training.serving.engines import write_untied_checkpoint  # noqa: E402

PROMPT = [[5, 17, 42, 9, 33, 8, 71]]


def lora_copy(model: torch.nn.Module, rank: int = 4, targets: tuple[str, ...] = ("all-linear",)) -> torch.nn.Module:
    return add_lora(copy.deepcopy(model), rank=rank, alpha=8.0, target_modules=list(targets))


def randomize_adapters(model: torch.nn.Module, seed: int = 0) -> None:
    """Non-zero B matrices, so the adapters change the policy."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.05 * torch.randn(parameter.shape, generator=generator))


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor(PROMPT)).logits


def test_adapters_start_as_the_identity_and_only_they_train(policy):
    model, _ = policy
    lora = lora_copy(model, rank=4)
    assert is_lora(lora) and not is_lora(model)
    torch.testing.assert_close(logits(lora), logits(model), rtol=0, atol=0)  # B starts at zero
    trained = {name: p.numel() for name, p in lora.named_parameters() if p.requires_grad}
    assert trained and all(".lora_A." in name or ".lora_B." in name for name in trained)
    # rank x (in + out) per adapted linear layer; every linear layer of every block, not the head.
    c = model.config
    h, kv, i = c.hidden_size, c.num_key_value_heads * c.head_dim, c.intermediate_size
    per_layer = 4 * ((h + h) + 2 * (h + kv) + (h + h) + 2 * (h + i) + (i + h))
    assert sum(trained.values()) == c.num_hidden_layers * per_layer
    only_q = lora_copy(model, rank=2, targets=("q_proj",))
    assert sum(p.numel() for p in only_q.parameters() if p.requires_grad) == c.num_hidden_layers * 2 * (h + h)


def test_engines_serve_the_merged_weights_and_training_stays_unmerged(policy, tmp_path):
    model, _ = policy
    lora = lora_copy(model)
    randomize_adapters(lora)
    base_before = {k: v.clone() for k, v in lora.get_base_model().state_dict().items()}
    served = serving_state_dict(lora)
    assert served.keys() == model.state_dict().keys()  # named as in the plain model
    plain = copy.deepcopy(model)
    plain.load_state_dict(served)
    torch.testing.assert_close(logits(plain), logits(lora), rtol=0, atol=1e-5)
    assert (logits(plain) - logits(model)).abs().max() > 1e-3  # the adapters do change the policy
    # The directory vLLM loads holds the same merged weights, with an untied output head.
    from transformers import AutoModelForCausalLM

    write_untied_checkpoint(lora, str(tmp_path))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True)
    assert not reloaded.config.tie_word_embeddings
    torch.testing.assert_close(logits(reloaded), logits(lora), rtol=0, atol=1e-5)
    after = lora.get_base_model().state_dict()
    assert all(torch.equal(after[k], v) for k, v in base_before.items())  # nothing was merged in place


def test_checkpoint_holds_the_adapter_and_loads_as_a_merged_policy(policy, tmp_path):
    model, tokenizer = policy
    lora = lora_copy(model)
    randomize_adapters(lora)
    path = checkpoint.save_checkpoint(
        tmp_path, 1, model=lora, tokenizer=tokenizer, optimizer=None, config={}, trainer_state={}
    )
    files = {p.name: p.stat().st_size for p in (path / "model").iterdir()}
    assert ADAPTER_CONFIG in files and "model.safetensors" not in files
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert files["adapter_model.safetensors"] < 0.2 * full_bytes
    recorded = json.loads((path / "model" / ADAPTER_CONFIG).read_text())["base_model_name_or_path"]
    assert recorded == str(Path(model.name_or_path).resolve())  # the adapter names its base model's directory

    merged, _ = load_policy(path / "model")
    assert not is_lora(merged)
    torch.testing.assert_close(logits(merged), logits(lora), rtol=0, atol=1e-5)
    fresh = lora_copy(model)  # what a resumed run builds before loading the checkpoint
    checkpoint.load_model_weights(fresh, path / "model")
    saved = dict(lora.named_parameters())
    assert all(torch.equal(p, saved[name]) for name, p in fresh.named_parameters() if p.requires_grad)


def test_mismatched_checkpoints_and_settings_are_clear_errors(policy, tmp_path):
    model, tokenizer = policy
    lora_dir = (
        checkpoint.save_checkpoint(
            tmp_path / "lora",
            1,
            model=lora_copy(model),
            tokenizer=tokenizer,
            optimizer=None,
            config={},
            trainer_state={},
        )
        / "model"
    )
    full_dir = (
        checkpoint.save_checkpoint(
            tmp_path / "full", 1, model=model, tokenizer=tokenizer, optimizer=None, config={}, trainer_state={}
        )
        / "model"
    )
    with pytest.raises(checkpoint.CheckpointError, match="holds a LoRA adapter but the model has none"):
        checkpoint.load_model_weights(copy.deepcopy(model), lora_dir)
    with pytest.raises(checkpoint.CheckpointError, match="holds no LoRA adapter"):
        checkpoint.load_model_weights(lora_copy(model), full_dir)
    with pytest.raises(checkpoint.CheckpointError, match="has shape"):
        checkpoint.load_model_weights(lora_copy(model, rank=8), lora_dir)
    config = json.loads((lora_dir / ADAPTER_CONFIG).read_text())
    (lora_dir / ADAPTER_CONFIG).write_text(json.dumps({**config, "base_model_name_or_path": str(tmp_path / "gone")}))
    with pytest.raises(FileNotFoundError, match="base model .* is not a local model directory"):
        load_policy(lora_dir)
    with pytest.raises(ValueError, match=r"policy.lora_target_modules \['qkv_fused'\]"):
        lora_copy(model, targets=("qkv_fused",))
    for override, key in (
        ("policy.lora_rank=-1", "policy.lora_rank"),
        ("policy.lora_alpha=0", "policy.lora_alpha"),
        ("policy.lora_target_modules=[]", "policy.lora_target_modules"),
    ):
        with pytest.raises(ConfigError, match=key):
            load_config(overrides=[override])


@pytest.mark.slow
def test_a_lora_run_changes_only_the_adapted_weights(tmp_path, policy):
    from test_trainer import tiny_overrides  # tests/training/ is on the path

    from agent_rl.training.loop.trainer import train

    model, _ = policy
    run_dir = tmp_path / "run"
    train(
        load_config(
            overrides=tiny_overrides(
                run_dir,
                "policy.lora_rank=4",
                "policy.lora_target_modules=[q_proj, v_proj]",
                "algo.kl_coef=0.01",
                "sft.lr=1e-2",
                "optim.lr=1e-2",
            )
        )
    )
    merged, _ = load_policy(checkpoint.find_checkpoint(run_dir, "last").model_dir)
    base, trained = model.state_dict(), merged.state_dict()
    changed = {name for name in base if not torch.equal(base[name], trained[name])}
    assert changed and all(name.endswith(("q_proj.weight", "v_proj.weight")) for name in changed), changed
