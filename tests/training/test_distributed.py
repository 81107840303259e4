"""Scale-out: Ray generation replicas behave like the local engine they wrap."""

from __future__ import annotations

import copy

import pytest
import torch

from agent_rl.training.models.policy import load_policy
from agent_rl.training.serving.engines import HFEngine, SamplingParams
from agent_rl.training.serving.logprobs import sequence_logprobs

pytestmark = pytest.mark.ray


def _prompts(tokenizer):
    texts = ["You are in the dusty kitchen.", "Exits: north, south.", "take brass key", "go west", "look"]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


@pytest.mark.slow
def test_ray_replicas_match_the_local_engine_before_and_after_a_weight_update(ray_local):
    from agent_rl.training.serving.engines import RayEngine

    model, tokenizer = load_policy("embedded")
    prompts = _prompts(tokenizer)
    greedy = SamplingParams(max_new_tokens=6, greedy=True)
    engine = RayEngine(model, tokenizer, n_replicas=2, kind="hf", num_cpus_per_replica=0.5)
    try:
        remote = engine.generate(prompts, 2, greedy)
        local = HFEngine(model, tokenizer).generate(prompts, 2, greedy)
        assert [[c.token_ids for c in group] for group in remote] == [[c.token_ids for c in group] for group in local]
        for got, want in zip(remote, local):
            torch.testing.assert_close(torch.tensor(got[0].logprobs), torch.tensor(want[0].logprobs))

        changed = copy.deepcopy(model)
        with torch.no_grad():
            for parameter in changed.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.05)
        engine.update_weights(changed)
        sampled = engine.generate(prompts, 1, SamplingParams(max_new_tokens=6, temperature=0.8))
        after = engine.generate(prompts, 1, greedy)
        expected = HFEngine(changed, tokenizer).generate(prompts, 1, greedy)
        assert [g[0].token_ids for g in after] == [g[0].token_ids for g in expected]
        # Sampled tokens' logprobs are those of the new weights at temperature 0.8.
        logp, mask = sequence_logprobs(changed, prompts, [g[0].token_ids for g in sampled], temperature=0.8)
        for row, group in enumerate(sampled):
            torch.testing.assert_close(
                logp[row, : len(group[0].logprobs)], torch.tensor(group[0].logprobs), atol=1e-4, rtol=0
            )
    finally:
        engine.close()


def test_ray_engine_rejects_bad_arguments(ray_local):
    from agent_rl.training.serving.engines import RayEngine

    model, tokenizer = load_policy("embedded")
    with pytest.raises(ValueError, match="n_replicas"):
        RayEngine(model, tokenizer, n_replicas=0)
    with pytest.raises(ValueError, match="hf or vllm"):
        RayEngine(model, tokenizer, kind="auto")


@pytest.mark.slow
def test_trainer_on_ray_env_actors_matches_the_local_trainer(ray_local, tmp_path):
    """Ray environment actors change where environments run, not what they do: same rollouts, same
    updates, same weights after 2 iterations."""
    from safetensors.torch import load_file
    from test_trainer import tiny_overrides  # tests/training/ is on the path (pytest's rootdir-relative import)

    from agent_rl.config import load_config
    from agent_rl.training.infra import checkpoint
    from agent_rl.training.infra.logger import read_metrics
    from agent_rl.training.loop.trainer import train

    runs = {}
    for name, extra in (("local", ()), ("ray", ("scale.env_actors=2",)), ("replicas", ("scale.engine_replicas=2",))):
        summary = train(load_config(overrides=tiny_overrides(tmp_path / name, *extra)))
        assert summary["iterations"] == 2
        runs[name] = load_file(checkpoint.find_checkpoint(tmp_path / name, "last").model_dir / "model.safetensors")
        assert [r["iteration"] for r in read_metrics(tmp_path / name)] == [0, 1, 2]
    for key, tensor in runs["local"].items():
        torch.testing.assert_close(runs["ray"][key], tensor, rtol=0, atol=0)
