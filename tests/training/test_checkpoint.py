"""Checkpoints: exact round trip of weights, optimizer and RNG states; atomicity; clear errors."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from agent_rl.training.infra import checkpoint as ckpt


def _tiny_model_and_tokenizer(seed: int = 0, hidden: int = 16):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=32,
        hidden_size=hidden,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=True,
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
        run_dir,
        iteration,
        model=model,
        tokenizer=tokenizer,
        optimizer=optimizer,
        config={"trainer": {"iterations": 4, "seed": 0}},
        trainer_state={"best": 0.5},
        generators=generators or {},
        pointers=pointers,
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
        found,
        model=model,
        optimizer=optimizer,
        config={"trainer": {"iterations": 8, "seed": 0}},
        ignore_config=("trainer.iterations",),
    )


def test_manifest_lists_every_file(tmp_path, trained):
    model, tokenizer, optimizer = trained
    path = _save(tmp_path, model, tokenizer, optimizer, 1)
    manifest = json.loads((path / ckpt.MANIFEST).read_text())
    on_disk = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {ckpt.MANIFEST}
    assert set(manifest["files"]) == on_disk
    assert {"state.json", "optimizer.safetensors", "rng.safetensors"} <= on_disk


def _leftovers(run_dir: Path) -> list[str]:
    return [p.name for p in (run_dir / ckpt.CHECKPOINTS).iterdir() if p.name.startswith(ckpt.LEFTOVER_PREFIX)]


def test_checkpoint_bytes_counts_the_weights_once_and_the_optimizer_moments(tmp_path, trained):
    model, tokenizer, optimizer = trained
    parameters = sum(p.numel() for p in model.parameters())  # the tied embedding once
    # float32 weights and buffers; AdamW keeps exp_avg, exp_avg_sq (float32) and a float32 step per parameter.
    buffers = sum(
        b.numel() for b in model.buffers() if b.data_ptr() in {t.data_ptr() for t in model.state_dict().values()}
    )
    n_tensors = len(list(model.parameters()))
    assert ckpt.checkpoint_bytes(model, optimizer) == 4 * (parameters + buffers) + 4 * (2 * parameters + n_tensors)
    assert ckpt.checkpoint_bytes(model, None) == 4 * (parameters + buffers)
    path = _save(tmp_path, model, tokenizer, optimizer, 1)
    written = sum(entry["bytes"] for entry in json.loads((path / ckpt.MANIFEST).read_text())["files"].values())
    assert ckpt.checkpoint_bytes(model, optimizer) <= written  # the tokenizer and JSON files come on top


@pytest.mark.parametrize("failing_write", [1, 2, 3])
def test_a_save_whose_writes_fail_part_way_leaves_the_previous_checkpoint_and_every_pointer(
    tmp_path, trained, monkeypatch, failing_write
):
    """Writes 1-3: the model, the optimizer tensors, the RNG tensors; the disk fills at one of them."""
    model, tokenizer, optimizer = trained
    _save(tmp_path, model, tokenizer, optimizer, 1, pointers=("last", "best"))
    writes = {"n": 0}
    real_save_file, real_save_pretrained = ckpt.save_file, model.save_pretrained

    def count_then_fail(write):
        def wrapped(*args, **kwargs):
            writes["n"] += 1
            if writes["n"] == failing_write:
                raise OSError(errno.ENOSPC, "No space left on device")
            return write(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(ckpt, "save_file", count_then_fail(real_save_file))
    monkeypatch.setattr(model, "save_pretrained", count_then_fail(real_save_pretrained))
    with pytest.raises(ckpt.CheckpointError, match=r"No space left on device.*needs about [\d,]+ MB .* are unchanged"):
        _save(tmp_path, model, tokenizer, optimizer, 2, pointers=("last", "best"))
    monkeypatch.undo()
    assert ckpt.find_checkpoint(tmp_path, "last").iteration == 1
    assert ckpt.find_checkpoint(tmp_path, "best").iteration == 1
    assert _leftovers(tmp_path) == [] and not (tmp_path / ckpt.CHECKPOINTS / "iter-000002").exists()


def test_too_little_free_space_is_refused_before_anything_is_written(tmp_path, trained, monkeypatch):
    model, tokenizer, optimizer = trained
    _save(tmp_path, model, tokenizer, optimizer, 1)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(ckpt.shutil, "disk_usage", lambda path: usage._replace(free=1000))
    needed = ckpt.checkpoint_bytes(model, optimizer) / 1e6
    with pytest.raises(
        ckpt.CheckpointError, match=f"too little free space. A checkpoint of this run needs about {needed:,.0f} MB"
    ):
        _save(tmp_path, model, tokenizer, optimizer, 2)
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / ckpt.CHECKPOINTS).iterdir()) == ["iter-000001", "last.json"]


def test_a_pointer_that_cannot_be_written_leaves_every_pointer_naming_a_complete_checkpoint(
    tmp_path, trained, monkeypatch
):
    model, tokenizer, optimizer = trained
    _save(tmp_path, model, tokenizer, optimizer, 1, pointers=("last", "best"))
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst).name == "best.json":
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        return real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", replace)
    with pytest.raises(ckpt.CheckpointError, match="pointer 'best' could not be updated"):
        _save(tmp_path, model, tokenizer, optimizer, 2, pointers=("last", "best"))
    monkeypatch.undo()
    assert ckpt.find_checkpoint(tmp_path, "last").iteration == 2
    assert ckpt.find_checkpoint(tmp_path, "best").iteration == 1
    assert _leftovers(tmp_path) == []  # the pointer's temporary file went with the failure


def test_leftovers_of_a_killed_save_do_not_count_as_checkpoints_and_are_removed(tmp_path, trained, monkeypatch):
    model, tokenizer, optimizer = trained
    assert not ckpt.holds_checkpoints(tmp_path)
    monkeypatch.setattr(ckpt, "capture_rng", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, model, tokenizer, optimizer, 1)
    monkeypatch.undo()
    (tmp_path / ckpt.CHECKPOINTS / f"{ckpt.LEFTOVER_PREFIX}last.json-123").write_text("{")
    assert len(_leftovers(tmp_path)) == 2 and not ckpt.holds_checkpoints(tmp_path)
    left = sorted(_leftovers(tmp_path))
    assert ckpt.remove_leftovers(tmp_path) == left
    assert _leftovers(tmp_path) == [] and ckpt.saved_iteration(tmp_path) is None
    _save(tmp_path, model, tokenizer, optimizer, 1)
    assert ckpt.holds_checkpoints(tmp_path) and ckpt.saved_iteration(tmp_path) == 1


def test_a_missing_or_corrupt_checkpoint_is_refused_with_the_intact_ones_and_their_commands(tmp_path, trained):
    from agent_rl.config import config_to_dict, load_config

    model, tokenizer, optimizer = trained
    config = load_config()

    def save(iteration, pointers):
        ckpt.save_checkpoint(
            tmp_path,
            iteration,
            model=model,
            tokenizer=tokenizer,
            optimizer=optimizer,
            config=config_to_dict(config),
            trainer_state={},
            pointers=pointers,
        )

    def resume(which="last"):
        return ckpt.resume_run(
            tmp_path, config, model=model, optimizer=optimizer, generators={}, may_change=(), which=which
        )

    save(0, ("last", "sft"))
    save(1, ("last", "best"))
    save(2, ("last",))
    weights = tmp_path / ckpt.CHECKPOINTS / "iter-000002" / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"!")
    with pytest.raises(ckpt.CheckpointError) as refused:
        resume()
    assert str(refused.value).endswith(
        f"is corrupt (checksum mismatch); nothing was loaded, and its intact checkpoints resume with: "
        f"'best' (iteration 1): agent-rl train --resume {tmp_path} --resume-from best; "
        f"'sft' (iteration 0): agent-rl train --resume {tmp_path} --resume-from sft"
    )
    assert resume("best")[0] == 1
    (tmp_path / ckpt.CHECKPOINTS / "best.json").unlink()
    (tmp_path / ckpt.CHECKPOINTS / "iter-000000" / "state.json").write_text("{}")
    with pytest.raises(
        ckpt.CheckpointError, match="no 'best' checkpoint .* no other intact checkpoint: start a new run"
    ):
        resume("best")


def test_rewinding_to_an_earlier_checkpoint_moves_the_later_pointers_and_drops_what_they_named(tmp_path, trained):
    model, tokenizer, optimizer = trained
    _save(tmp_path, model, tokenizer, optimizer, 0, pointers=("last", "sft"))
    _save(tmp_path, model, tokenizer, optimizer, 1, pointers=("last", "best"))
    _save(tmp_path, model, tokenizer, optimizer, 2, pointers=("last", "best"))
    _save(tmp_path, model, tokenizer, optimizer, 3)
    root = tmp_path / ckpt.CHECKPOINTS

    def named() -> dict[str, int]:
        return {name: ckpt.find_checkpoint(tmp_path, name).iteration for name in ckpt.POINTERS}

    assert ckpt.rewind(tmp_path, "last") == [] and named() == {"last": 3, "best": 2, "sft": 0}
    assert ckpt.rewind(tmp_path, "best") == ["last"] and named() == {"last": 2, "best": 2, "sft": 0}
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["iter-000000", "iter-000002"]
    (root / "best.json").write_text("{not json")  # unreadable counts as stale
    assert ckpt.rewind(tmp_path, "sft") == ["last", "best"] and named() == {"last": 0, "best": 0, "sft": 0}
    assert [p.name for p in root.iterdir() if p.is_dir()] == ["iter-000000"]


def test_a_saved_config_in_an_earlier_spelling_is_the_same_config():
    # Checkpoints written when step credit was a switch hold algo.step_credit: true (now "anchor").
    saved = {"algo": {"step_credit": True, "preset": "gigpo"}}
    assert ckpt.config_differences(saved, {"algo": {"step_credit": "anchor", "preset": "gigpo"}}) == []
    assert ckpt.config_differences({"algo": {"step_credit": False}}, {"algo": {"step_credit": "none"}}) == []
    assert ckpt.config_differences(saved, {"algo": {"step_credit": "graph", "preset": "gigpo"}}) == ["algo.step_credit"]
