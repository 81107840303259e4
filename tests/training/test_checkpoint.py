"""Checkpoints: exact round trip of weights, optimizer and RNG states; atomicity; clear errors."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from training import checkpoint as ckpt


def _tiny_model_and_tokenizer(seed: int = 0, hidden: int = 16):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=32, hidden_size=hidden, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)
    vocab = {f"w{i}": i for i in range(32)}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="w0", pad_token="w1", eos_token="w2")
    return model, tokenizer


def _train_steps(model, optimizer, steps: int = 2) -> None:
    for _ in range(steps):
        ids = torch.randint(0, 32, (2, 6))
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _save(run_dir: Path, model, tokenizer, optimizer, iteration: int, generators=None, pointers=("last",)):
    return ckpt.save_checkpoint(
        run_dir, iteration, model=model, tokenizer=tokenizer, optimizer=optimizer,
        config={"trainer": {"iterations": 4, "seed": 0}}, trainer_state={"best": 0.5},
        generators=generators or {}, pointers=pointers,
    )


@pytest.fixture
def trained(tmp_path):
    model, tokenizer = _tiny_model_and_tokenizer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _train_steps(model, optimizer)
    return model, tokenizer, optimizer


def test_round_trip_is_exact_and_continues_identically(tmp_path, trained):
    model, tokenizer, optimizer = trained
    stream = np.random.default_rng(7)
    stream.integers(100)
    torch.manual_seed(3), np.random.seed(4), random.seed(5)
    _save(tmp_path, model, tokenizer, optimizer, 2, generators={"seeds": stream})

    # Continue the original for two steps and draw from every RNG.
    _train_steps(model, optimizer)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    expected_draws = (stream.integers(10**9), random.random(), np.random.rand(), torch.rand(1).item())

    # A fresh model/optimizer/stream, with every RNG disturbed, restored from disk.
    model2, _ = _tiny_model_and_tokenizer(seed=99)
    optimizer2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    stream2 = np.random.default_rng(12345)
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    found = ckpt.find_checkpoint(tmp_path, "last")
    assert found.iteration == 2
    state = ckpt.restore(found, model=model2, optimizer=optimizer2, generators={"seeds": stream2})
    assert state == {"best": 0.5}
    _train_steps(model2, optimizer2)
    for key, value in model2.state_dict().items():
        assert torch.equal(value, expected[key]), key
    assert (stream2.integers(10**9), random.random(), np.random.rand(), torch.rand(1).item()) == expected_draws


def test_checkpoint_dir_is_a_loadable_model_directory(tmp_path, trained):
    from transformers import AutoModelForCausalLM

    model, tokenizer, optimizer = trained
    path = _save(tmp_path, model, tokenizer, optimizer, 1)
    loaded = AutoModelForCausalLM.from_pretrained(path / "model", local_files_only=True)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_pointers_prune_and_best(tmp_path, trained):
    model, tokenizer, optimizer = trained
    _save(tmp_path, model, tokenizer, optimizer, 1, pointers=("last", "best"))
    _save(tmp_path, model, tokenizer, optimizer, 2)
    _save(tmp_path, model, tokenizer, optimizer, 3)
    root = tmp_path / ckpt.CHECKPOINTS
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["iter-000001", "iter-000003"]
    assert ckpt.find_checkpoint(tmp_path, "best").iteration == 1
    assert ckpt.find_checkpoint(tmp_path, "last").iteration == 3


def test_kill_during_save_keeps_previous_checkpoint(tmp_path, trained, monkeypatch):
    model, tokenizer, optimizer = trained
    _save(tmp_path, model, tokenizer, optimizer, 1)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(ckpt, "capture_rng", killed)  # dies after the model files were written
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, model, tokenizer, optimizer, 2)
    monkeypatch.undo()
    assert ckpt.find_checkpoint(tmp_path, "last").iteration == 1
    leftovers = [p.name for p in (tmp_path / ckpt.CHECKPOINTS).iterdir() if p.name.startswith(".tmp-")]
    assert leftovers  # the partial directory exists but is never pointed to; the next save prunes it
    _save(tmp_path, model, tokenizer, optimizer, 3)
    assert not [p for p in (tmp_path / ckpt.CHECKPOINTS).iterdir() if p.name.startswith(".tmp-")]


def test_corruption_is_detected(tmp_path, trained):
    model, tokenizer, optimizer = trained
    path = _save(tmp_path, model, tokenizer, optimizer, 1)
    weights = next((path / "model").glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError, match="corrupt"):
        ckpt.find_checkpoint(tmp_path)


def test_missing_file_bad_json_and_missing_pointer(tmp_path, trained):
    model, tokenizer, optimizer = trained
    with pytest.raises(ckpt.CheckpointError, match="no 'last' checkpoint"):
        ckpt.find_checkpoint(tmp_path)
    path = _save(tmp_path, model, tokenizer, optimizer, 1)
    (path / "optimizer.safetensors").unlink()
    with pytest.raises(ckpt.CheckpointError, match="'optimizer.safetensors' is missing"):
        ckpt.find_checkpoint(tmp_path)
    path = _save(tmp_path, model, tokenizer, optimizer, 2)
    (tmp_path / ckpt.CHECKPOINTS / "last.json").write_text("{not json")
    with pytest.raises(ckpt.CheckpointError, match="not valid JSON"):
        ckpt.find_checkpoint(tmp_path)


def test_shape_and_config_mismatch(tmp_path, trained):
    model, tokenizer, optimizer = trained
    _save(tmp_path, model, tokenizer, optimizer, 1)
    found = ckpt.find_checkpoint(tmp_path)
    wider, _ = _tiny_model_and_tokenizer(hidden=32)
    with pytest.raises(ckpt.CheckpointError, match="shape"):
        ckpt.restore(found, model=wider, optimizer=None)
    with pytest.raises(ckpt.CheckpointError, match="different config: trainer.seed"):
        ckpt.restore(found, model=model, optimizer=optimizer, config={"trainer": {"iterations": 4, "seed": 1}})
    # Ignored keys (extending a run) are allowed.
    ckpt.restore(
        found, model=model, optimizer=optimizer,
        config={"trainer": {"iterations": 8, "seed": 0}}, ignore_config=("trainer.iterations",),
    )


def test_manifest_lists_every_file(tmp_path, trained):
    model, tokenizer, optimizer = trained
    path = _save(tmp_path, model, tokenizer, optimizer, 1)
    manifest = json.loads((path / ckpt.MANIFEST).read_text())
    on_disk = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {ckpt.MANIFEST}
    assert set(manifest["files"]) == on_disk
    assert {"state.json", "optimizer.safetensors", "rng.safetensors"} <= on_disk
