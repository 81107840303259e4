"""Generation engines (hf always, vllm when importable): shapes, seeding, and logprobs that match
the learner's recomputation before and after weight syncs."""

from __future__ import annotations

import copy
import importlib.util

import numpy as np
import pytest
import torch

from agent_rl.training.serving.engines import HFEngine, SamplingParams, make_engine
from agent_rl.training.serving.logprobs import sequence_logprobs

TOLERANCE = 1e-3  # max abs logprob difference, float32


@pytest.fixture(scope="module")
def prompts(policy):
    _, tokenizer = policy
    rng = np.random.default_rng(0)
    texts = ["You are in the hall.", "Exits: north, east.", "go north", "take amber key", "You see: nothing."]
    # Varied lengths exercise left padding.
    return [
        tokenizer(" ".join(rng.choice(texts, size=int(k))), add_special_tokens=False)["input_ids"]
        for k in (1, 3, 6, 2, 9)
    ]


def perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    other = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return other


def max_logprob_gap(model, prompts, completions, temperature: float) -> float:
    flat_prompts = [p for p, group in zip(prompts, completions) for _ in group]
    responses = [c.token_ids for group in completions for c in group]
    with torch.no_grad():
        logp, mask = sequence_logprobs(model, flat_prompts, responses, temperature)
    engine_logp = torch.zeros_like(logp)
    for i, c in enumerate(c for group in completions for c in group):
        engine_logp[i, : len(c.logprobs)] = torch.tensor(c.logprobs)
    return float(((logp - engine_logp) * mask).abs().max())


def check_shapes(completions, n_prompts: int, n: int, max_new_tokens: int, stop_ids: list[int]) -> None:
    assert len(completions) == n_prompts and all(len(group) == n for group in completions)
    for c in (c for group in completions for c in group):
        assert 1 <= len(c.token_ids) <= max_new_tokens and len(c.logprobs) == len(c.token_ids)
        assert all(lp <= 0 for lp in c.logprobs)
        stops = [i for i, t in enumerate(c.token_ids) if t in stop_ids]
        if c.finish_reason == "stop":
            assert stops == [len(c.token_ids) - 1]  # the stop token ends the completion, once
        else:
            assert c.finish_reason == "length" and not stops and len(c.token_ids) == max_new_tokens


# ---- hf engine ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(1.0, 1.0, 8), SamplingParams(0.7, 1.0, 8), SamplingParams(max_new_tokens=8, greedy=True)],
    ids=["t1", "t0.7", "greedy"],
)
def test_hf_shapes_and_logprobs_match_recomputation(policy, prompts, sampling):
    model, tokenizer = policy
    engine = HFEngine(model, tokenizer, max_batch_size=4, seed=1)
    completions = engine.generate(prompts, 2, sampling)
    check_shapes(completions, len(prompts), 2, 8, engine.stop_ids)
    temperature = 1.0 if sampling.greedy else sampling.temperature
    assert max_logprob_gap(model, prompts, completions, temperature) < TOLERANCE


def test_hf_greedy_is_argmax_and_deterministic(policy, prompts):
    model, tokenizer = policy
    engine = HFEngine(model, tokenizer)
    first = engine.generate(prompts, 2, SamplingParams(max_new_tokens=6, greedy=True))
    again = engine.generate(prompts, 1, SamplingParams(max_new_tokens=6, greedy=True))
    for p, group, other in zip(prompts, first, again):
        assert group[0].token_ids == group[1].token_ids == other[0].token_ids
        with torch.no_grad():
            logits = model(torch.tensor([p + group[0].token_ids])).logits[0, len(p) - 1 : -1]
        assert logits.argmax(-1).tolist() == group[0].token_ids


def test_hf_sampling_is_seeded(policy, prompts):
    model, tokenizer = policy
    sampling = SamplingParams(max_new_tokens=8)
    a = HFEngine(model, tokenizer, seed=3).generate(prompts, 2, sampling)
    b = HFEngine(model, tokenizer, seed=3).generate(prompts, 2, sampling)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]


def test_hf_top_p_logprobs_are_renormalized(policy, prompts):
    # Under a nucleus, the sampled token's probability is renormalized over the kept mass: never lower.
    model, tokenizer = policy
    completions = HFEngine(model, tokenizer).generate(prompts, 2, SamplingParams(1.0, 0.5, 8))
    flat = [c for g in completions for c in g]
    with torch.no_grad():
        logp, _ = sequence_logprobs(model, [p for p in prompts for _ in range(2)], [c.token_ids for c in flat])
    for i, c in enumerate(flat):
        assert np.all(np.array(c.logprobs) >= logp[i, : len(c.logprobs)].numpy() - 1e-5)


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_hf_prefills_a_shared_prefix_once_with_the_same_completions(policy, prompts, monkeypatch, greedy):
    """Prompts that start alike (a system prompt, a rules text) prefill that prefix once and repeat its
    KV cache over the rows: the completions are those of separate prefills, token for token."""
    from agent_rl.training.models import prefix_sharing

    model, tokenizer = policy
    system = tokenizer("Rules: go north to win. Exits are listed. " * 3, add_special_tokens=False)["input_ids"]
    shared = [system + p for p in prompts] + [system[:-1], system]  # the shortest rows end inside the prefix
    sampling = SamplingParams(max_new_tokens=8, greedy=greedy)
    prefills = []
    repeated_prefix_cache = prefix_sharing.repeated_prefix_cache
    monkeypatch.setattr(
        prefix_sharing,
        "repeated_prefix_cache",
        lambda *args: prefills.append(len(args[1])) or repeated_prefix_cache(*args),
    )
    once = HFEngine(model, tokenizer, seed=5).generate(shared, 2, sampling)
    assert prefills == [len(system) - 2]  # the common prefix, short of the shortest row's last token
    separately = HFEngine(model, tokenizer, seed=5, share_prefixes=False).generate(shared, 2, sampling)
    assert len(prefills) == 1
    assert [[c.token_ids for c in g] for g in once] == [[c.token_ids for c in g] for g in separately]
    gaps = [abs(a - b) for g, h in zip(once, separately) for c, d in zip(g, h) for a, b in zip(c.logprobs, d.logprobs)]
    assert max(gaps) < 1e-4
    assert max_logprob_gap(model, shared, once, 1.0) < TOLERANCE


def test_hf_update_weights_uses_the_new_model(policy, prompts):
    model, tokenizer = policy
    engine = HFEngine(model, tokenizer)
    new_model = perturbed(model, seed=0)
    engine.update_weights(new_model)
    completions = engine.generate(prompts, 2, SamplingParams(max_new_tokens=8))
    assert max_logprob_gap(new_model, prompts, completions, 1.0) < TOLERANCE
    assert max_logprob_gap(model, prompts, completions, 1.0) > 1e-2


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_hf_prefills_each_distinct_prompt_once_with_the_same_completions(policy, prompts, greedy):
    """Prompts that repeat (a group's first turn, a state several episodes reached) and share no
    prefix: each distinct one is prefilled once, and the completions are those of separate prefills."""
    model, tokenizer = policy
    repeated = [prompts[0], prompts[1], prompts[0], prompts[2], prompts[1]]
    from agent_rl.training.models.prefix_sharing import shared_prefix_length

    assert shared_prefix_length(repeated) == 0
    forwarded = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, a, out: forwarded.append(tuple(a[0].shape)))
    try:
        once = HFEngine(model, tokenizer, seed=5).generate(repeated, 2, SamplingParams(max_new_tokens=8, greedy=greedy))
    finally:
        hook.remove()
    assert forwarded[0][0] == 3  # the three distinct prompts, before generate's first step over 10 rows
    separately = HFEngine(model, tokenizer, seed=5, share_prefixes=False).generate(
        repeated, 2, SamplingParams(max_new_tokens=8, greedy=greedy)
    )
    assert [[c.token_ids for c in g] for g in once] == [[c.token_ids for c in g] for g in separately]
    assert max_logprob_gap(model, repeated, once, 1.0) < TOLERANCE


def test_engine_and_sampling_arguments_are_validated(policy):
    model, tokenizer = policy
    with pytest.raises(ValueError, match="unknown engine"):
        make_engine("tgi", model, tokenizer)
    with pytest.raises(
        ValueError, match="unknown engine 'auto'"
    ):  # training.infra.resolution.resolve decides what auto is
        make_engine("auto", model, tokenizer)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=1.5)
    with pytest.raises(ValueError, match="empty"):
        HFEngine(model, tokenizer).generate([[]], 1, SamplingParams())


# ---- vllm engine ----------------------------------------------------------------------------------

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def test_engines_score_continuations_with_the_policy_they_serve(policy, prompts):
    model, tokenizer = policy
    continuations = [prompts[(i + 1) % len(prompts)][:3] for i in range(len(prompts))]
    engine = HFEngine(model, tokenizer, max_batch_size=2)  # three forward passes, as one would score
    logp, mask = sequence_logprobs(model, prompts, continuations, 0.7)
    scored = engine.score(prompts, continuations, 0.7)
    assert [len(s) for s in scored] == [len(c) for c in continuations]
    for row, values in enumerate(scored):
        np.testing.assert_allclose(values, logp[row][mask[row].bool()].detach().numpy(), atol=1e-6)
    new_model = perturbed(model, seed=0)
    engine.update_weights(new_model)
    new_logp, _ = sequence_logprobs(new_model, prompts[:1], continuations[:1], 0.7)
    np.testing.assert_allclose(
        engine.score(prompts[:1], continuations[:1], 0.7)[0], new_logp[0].detach().numpy(), atol=1e-6
    )
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        engine.score([[]], [[1]], 1.0)


@pytest.fixture(scope="module")
def vllm_engine(policy):
    model, tokenizer = policy
    engine = make_engine(
        "vllm", model, tokenizer, kv_cache_memory_bytes=64 * 2**20, max_model_len=512, enforce_eager=True
    )
    yield engine
    engine.close()


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")
@pytest.mark.slow
def test_vllm_logprobs_match_the_training_model_then_follow_weight_updates(policy, prompts, vllm_engine, capfd):
    model, tokenizer = policy
    for sampling in (SamplingParams(1.0, 1.0, 12), SamplingParams(0.7, 1.0, 12)):
        completions = vllm_engine.generate(prompts, 3, sampling)
        check_shapes(completions, len(prompts), 3, 12, vllm_engine.stop_ids)
        assert max_logprob_gap(model, prompts, completions, sampling.temperature) < TOLERANCE

    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    hf_greedy = HFEngine(model, tokenizer).generate(prompts, 1, greedy)
    vllm_greedy = vllm_engine.generate(prompts, 2, greedy)
    assert (
        [g[0].token_ids for g in vllm_greedy]
        == [g[1].token_ids for g in vllm_greedy]
        == [g[0].token_ids for g in hf_greedy]
    )

    # Weight sync: after update_weights the engine samples from (and scores under) the new weights.
    new_model = perturbed(model, seed=1)
    capfd.readouterr()
    vllm_engine.update_weights(new_model)
    noise = "".join(capfd.readouterr())  # a sync prints nothing between the iteration tables
    assert "Loading safetensors" not in noise and "Failed to load weights" not in noise, noise
    completions = vllm_engine.generate(prompts, 3, SamplingParams(1.0, 1.0, 12))
    assert max_logprob_gap(new_model, prompts, completions, 1.0) < TOLERANCE
    assert max_logprob_gap(model, prompts, completions, 1.0) > 1e-2
    hf_scores = HFEngine(new_model, tokenizer).score(prompts, prompts[::-1], 0.7)  # scoring follows too
    for vllm_score, hf_score in zip(vllm_engine.score(prompts, prompts[::-1], 0.7), hf_scores):
        np.testing.assert_allclose(vllm_score, hf_score, atol=1e-6)
    new_greedy = vllm_engine.generate(prompts, 1, greedy)
    assert [g[0].token_ids for g in new_greedy] == [
        g[0].token_ids for g in HFEngine(new_model, tokenizer).generate(prompts, 1, greedy)
    ]

    # ... and back: syncing the original weights restores the original behaviour (prefix cache reset).
    vllm_engine.update_weights(model)
    assert [g[0].token_ids for g in vllm_engine.generate(prompts, 1, greedy)] == [g[0].token_ids for g in hf_greedy]


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")
@pytest.mark.slow
def test_vllm_sends_identical_prompts_as_one_request(policy, prompts, vllm_engine, monkeypatch):
    model, tokenizer = policy
    repeated = [prompts[0], prompts[1], prompts[0], prompts[2], prompts[0]]
    sent = []
    generate = vllm_engine.llm.generate

    def spy(requests, params, **kwargs):
        sent.append([(r["prompt_token_ids"], p.n) for r, p in zip(requests, params)])
        return generate(requests, params, **kwargs)

    monkeypatch.setattr(vllm_engine.llm, "generate", spy)
    completions = vllm_engine.generate(repeated, 2, SamplingParams(1.0, 1.0, 12))
    assert sent[-1] == [(prompts[0], 6), (prompts[1], 2), (prompts[2], 2)]
    check_shapes(completions, len(repeated), 2, 12, vllm_engine.stop_ids)
    # Each prompt's completions are scored under that prompt: results come back in request order.
    assert max_logprob_gap(model, repeated, completions, 1.0) < TOLERANCE

    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    vllm_greedy = vllm_engine.generate(repeated, 2, greedy)
    assert sent[-1] == [(prompts[0], 1), (prompts[1], 1), (prompts[2], 1)]
    expected = [g[0].token_ids for g in HFEngine(model, tokenizer).generate(repeated, 1, greedy)]
    assert [[c.token_ids for c in g] for g in vllm_greedy] == [[t, t] for t in expected]
    assert vllm_greedy[0][0] is not vllm_greedy[0][1]  # copies, not one shared object


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")
@pytest.mark.slow
def test_vllm_serves_a_lora_policy_with_its_adapters_merged(policy, prompts, vllm_engine):
    pytest.importorskip("peft", reason="peft (the lora extra) is not installed")
    from agent_rl.training.models.policy import add_lora

    model, _ = policy
    lora = add_lora(copy.deepcopy(model), rank=4, alpha=8.0, target_modules=["all-linear"])
    with torch.no_grad():
        for name, parameter in lora.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.05)
    vllm_engine.update_weights(lora)
    completions = vllm_engine.generate(prompts, 3, SamplingParams(1.0, 1.0, 12))
    assert max_logprob_gap(lora, prompts, completions, 1.0) < TOLERANCE  # the learner's unmerged forward
    assert max_logprob_gap(model, prompts, completions, 1.0) > 1e-2
    vllm_engine.update_weights(model)
