"""The learner (training/loop/learner.py): teacher-forced logprobs with shared prefixes, micro-batch
planning, gradient accumulation that does not depend on the split, the minibatch update, logprob
recomputation and the frozen KL reference."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.progress import Progress

from agent_rl.config import load_config
from agent_rl.core.batch import StepBatch
from agent_rl.core.losses import LossSpec
from agent_rl.training.infra.resolution import resolve
from agent_rl.training.loop.learner import Learner, accumulate_policy_gradient, minibatch_count, step_scale, warmup_lr
from agent_rl.training.loop.micro_batches import merge_repeated_rows, plan_micro_batches
from agent_rl.training.serving.logprobs import (
    offered_entropy,
    offered_logprobs,
    recompute_logprobs,
    response_logits,
    sequence_logprobs,
    unsampled_rows,
)

# ---- teacher-forced logprobs (response_logits, sequence_logprobs) --------------------------------------------------


def test_sequence_logprobs_match_unpadded_forward_passes(policy):
    model, _ = policy
    prompts = [[1, 5, 9, 30], [1, 7], [1, 8, 8, 8, 8, 8, 8]]
    responses = [[11, 12, 13], [40], [2, 3, 50, 60, 70]]
    with torch.no_grad():
        logp, mask = sequence_logprobs(model, prompts, responses, temperature=0.5)
        assert logp.shape == mask.shape == (3, 5)
        assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]
        for i, (p, r) in enumerate(zip(prompts, responses)):
            logits = model(torch.tensor([p + r])).logits[0, len(p) - 1 : -1] / 0.5
            expected = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(r)[:, None])[:, 0]
            assert torch.allclose(logp[i, : len(r)], expected, atol=1e-5)
            assert torch.all(logp[i, len(r) :] == 0)


def test_response_logits_targets_and_mask(policy):
    model, _ = policy
    with torch.no_grad():
        logits, targets, mask = response_logits(model, [[1, 5], [1, 6, 7]], [[9, 10, 11], [12]])
        logp, _ = sequence_logprobs(model, [[1, 5], [1, 6, 7]], [[9, 10, 11], [12]])
    assert logits.shape == (2, 3, model.config.vocab_size)
    assert (targets * mask.long()).tolist() == [[9, 10, 11], [12, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert torch.allclose(torch.log_softmax(logits, -1).gather(2, targets[..., None])[..., 0] * mask, logp, atol=1e-6)


def test_shared_prefixes_and_repeated_prompts_are_forwarded_once_with_unchanged_logits_and_gradients(policy):
    model, _ = policy
    shared = [1, 5, 9, 30, 31, 32]
    # The last prompt is all shared prefix; the first and fourth are the same prompt.
    prompts = [shared + [7], shared + [8, 8, 8], shared, shared + [7]]
    responses = [[11, 12], [40], [2, 3, 50], [13, 14, 15]]
    widths = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, args, out: widths.append(tuple(args[0].shape)))
    try:
        logits, targets, mask = response_logits(model, prompts, responses)
    finally:
        hook.remove()
    # All but the last token of the shortest prompt once (its last token's logits predict a response),
    # then the 3 distinct rests of the prompts (at most 4 tokens), then the 4 responses but their
    # last tokens (at most 2).
    assert widths == [(1, 5), (3, 4), (4, 2)]
    parameters = [p for p in model.parameters() if p.requires_grad]
    logp = torch.log_softmax(logits, -1).gather(2, targets[..., None])[..., 0] * mask
    got = torch.autograd.grad(logp.sum(), parameters)
    expected_logp = []
    for i, (p, r) in enumerate(zip(prompts, responses)):
        row_logits = model(torch.tensor([p + r])).logits[0, len(p) - 1 : -1]
        expected_logp.append(torch.log_softmax(row_logits, -1).gather(1, torch.tensor(r)[:, None])[:, 0])
        torch.testing.assert_close(logp[i, : len(r)], expected_logp[-1], atol=1e-5, rtol=0)
    expected = torch.autograd.grad(torch.cat(expected_logp).sum(), parameters)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("sliding_window", [None, 3])
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_response_logits_equal_separate_forward_passes_for_any_mix_of_repeated_prompts(sliding_window, data):
    """Prompts drawn from a few (so some repeat, some share a prefix), responses of 0-4 tokens: each
    row's logits are its own forward pass's, with a full-attention model and a sliding-window one."""
    model = _tiny_model(sliding_window)
    pool = data.draw(st.lists(st.lists(st.integers(3, 39), min_size=1, max_size=6), min_size=1, max_size=3))
    head = data.draw(st.lists(st.integers(3, 39), max_size=5))
    picks = data.draw(st.lists(st.integers(0, len(pool) - 1), min_size=1, max_size=6))
    prompts = [head + pool[k] for k in picks]
    responses = [data.draw(st.lists(st.integers(3, 39), max_size=4)) for _ in picks]
    with torch.no_grad():
        logits, targets, mask = response_logits(model, prompts, responses)
        for i, (prompt, response) in enumerate(zip(prompts, responses)):
            own = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
            torch.testing.assert_close(logits[i, : len(response)], own, atol=1e-5, rtol=0)
            assert targets[i, : len(response)].tolist() == response and mask[i].sum() == len(response)


def test_sequence_logprobs_carry_gradients(policy):
    model, _ = policy
    logp, mask = sequence_logprobs(model, [[1, 5, 6]], [[7, 8]])
    (logp * mask).sum().backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)


def test_sequence_logprobs_reject_bad_input(policy):
    model, _ = policy
    with pytest.raises(ValueError, match="prompts but"):
        sequence_logprobs(model, [[1]], [[2], [3]])
    with pytest.raises(ValueError, match="at least one token"):
        sequence_logprobs(model, [[]], [[2]])


# ---- minibatch updates -----------------------------------------------------------------------------------


def test_minibatch_count():
    optim = load_config(overrides=["optim.minibatches=1", "optim.minibatch_size=0"]).optim
    assert optim.minibatch_size == 0
    assert minibatch_count(10, optim) == 1
    optim.minibatches = 4
    assert minibatch_count(10, optim) == 4
    assert minibatch_count(3, optim) == 3  # never more minibatches than rows
    optim.minibatch_size = 4
    assert minibatch_count(10, optim) == 2
    assert minibatch_count(3, optim) == 1


def test_step_scale_is_the_share_of_a_full_minibatch():
    optim = load_config(overrides=["optim.minibatch_size=8"]).optim
    assert [step_scale(k, optim) for k in (1, 4, 8, 20)] == [0.125, 0.5, 1.0, 1.0]
    optim.minibatch_size = 0  # minibatches are counted: every step is whole
    assert step_scale(1, optim) == 1.0


def test_minibatches_are_whole_trajectories_and_a_short_one_steps_at_its_share_of_lr(policy):
    """Rows 0-1, 2-4 and 5 belong to trajectories 7, 8 and 9. Counted minibatches (3) put one
    trajectory in each step; with minibatch_size=4 the 3 trajectories make one step at 3/4 of lr."""
    model, _ = policy
    prompts, responses, _ = _synthetic_rows(model.config.vocab_size, 6, seed=4)
    with torch.no_grad():
        logp, _ = sequence_logprobs(model, prompts, responses, 1.0)
    old = [row[: len(r)].numpy() for row, r in zip(logp, responses)]
    trajectories, advantages = np.array([7, 7, 8, 8, 8, 9]), np.array([1.0, 1.0, -0.5, -0.5, -0.5, 2.0])
    for overrides, steps, rows_per_step, rates in (
        (["optim.minibatches=3", "optim.minibatch_size=0"], 3, [[1], [2], [3]], [1e-3] * 3),
        (["optim.minibatch_size=4"], 1, [[6]], [7.5e-4]),
    ):
        config = resolve(
            load_config(
                overrides=[
                    *overrides,
                    "optim.lr=1e-3",
                    "optim.warmup_steps=0",
                    "optim.epochs=1",
                    "optim.min_steps=0",
                    "algo.loss=grpo",
                    "algo.kl_coef=0",
                    "engine=hf",
                ]
            )
        )
        trained = copy.deepcopy(model)
        optimizer = torch.optim.AdamW(trained.parameters(), lr=config.optim.lr)
        forwarded, seen_rates = [], []
        learner = Learner(trained, optimizer, config, np.random.default_rng(0))
        step = optimizer.step
        optimizer.step = lambda: (seen_rates.append(optimizer.param_groups[0]["lr"]), step())[1]
        original = accumulate_policy_gradient

        def record(*args, **kwargs):
            metrics = original(*args, **kwargs)
            forwarded.append([int(metrics["active_rows"] + metrics["repeated_rows"])])
            return metrics

        import agent_rl.training.loop.learner as learner_module

        learner_module.accumulate_policy_gradient = record
        try:
            with Progress(disable=True) as progress:
                metrics = learner.optimize(prompts, responses, old, advantages, progress, trajectories)
        finally:
            learner_module.accumulate_policy_gradient = original
        assert metrics["update/optimizer_steps"] == steps and metrics["update/learnable_trajectories"] == 3
        assert sorted(forwarded) == rows_per_step  # rows per step: one trajectory each, or all three
        assert seen_rates == pytest.approx(rates)
        assert optimizer.param_groups[0]["initial_lr"] == 1e-3  # the base rate stays, for the next update


def test_repeated_rows_are_merged_by_prompt_response_and_sign():
    prompts = [np.array(p) for p in ([1, 2], [1, 2], [1, 3], [1, 2], [1, 2], [1, 2])]
    responses = [np.array(r) for r in ([5], [5], [5], [6], [5], [5, 7])]
    advantages = np.array([0.5, 0.25, 1.0, -1.0, -2.0, 0.75])
    representatives, merged, counts = merge_repeated_rows(prompts, responses, np.arange(6), advantages)
    groups = {int(r): (float(a), int(c)) for r, a, c in zip(representatives, merged, counts)}
    # Rows 0, 1 (same prompt, response, positive), row 4 (same, negative), rows 2, 3 and 5 alone.
    assert groups == {0: (0.75, 2), 4: (-2.0, 1), 2: (1.0, 1), 3: (-1.0, 1), 5: (0.75, 1)}
    assert counts.sum() == 6 and merged.sum() == pytest.approx(advantages.sum())


def test_rows_that_offered_different_choices_are_not_merged():
    prompts, responses = [np.array([1, 2])] * 3, [np.array([5, 0])] * 3
    offered = [np.array([[5, 6], [0, -1]]), np.array([[5, 6], [0, -1]]), np.array([[5, 7], [0, -1]])]
    representatives, merged, counts = merge_repeated_rows(prompts, responses, np.arange(3), np.ones(3), offered)
    assert representatives.tolist() == [0, 2] and merged.tolist() == [2.0, 1.0] and counts.tolist() == [2, 1]
    assert merge_repeated_rows(prompts, responses, np.arange(3), np.ones(3))[2].tolist() == [3]


def test_offered_logprobs_renormalize_over_the_offered_tokens_by_hand():
    token_logp = torch.log(torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]]]))
    targets = torch.tensor([[2, 3, 0]])
    # Position 0 offers tokens 2 and 0, position 1 only its own token, position 2 offers nothing listed.
    offered = torch.tensor([[[2, 0], [3, -1], [-1, -1]]])
    got = offered_logprobs(token_logp, targets, offered)
    torch.testing.assert_close(got, torch.log(torch.tensor([[0.3 / 0.4, 1.0, 0.7]])))
    assert got[0, 1].item() == 0.0
    torch.testing.assert_close(offered_logprobs(token_logp, targets, None), torch.log(torch.tensor([[0.3, 0.25, 0.7]])))


def test_offered_entropy_is_the_choices_by_hand():
    probs = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]]])
    full = -(probs * probs.log()).sum(-1)
    offered = torch.tensor([[[2, 0], [3, -1], [-1, -1]]])  # a choice of 0.3 : 0.1, a forced token, free text
    got = offered_entropy(probs.log(), offered)
    choice = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    torch.testing.assert_close(got, torch.tensor([[choice, 0.0, full[0, 2].item()]]))
    assert got[0, 1].item() == 0.0
    torch.testing.assert_close(offered_entropy(probs.log(), None), full)


def test_a_token_the_choice_forced_carries_no_gradient(policy):
    model, _ = policy
    offered = [np.array([[7, 9], [8, -1]])]  # the first token is a choice, the second is forced
    logp, _ = sequence_logprobs(model, [[1, 5, 6]], [[7, 8]], choice_ids=offered)
    parameters = [p for p in model.parameters() if p.requires_grad]
    forced = torch.autograd.grad(logp[0, 1], parameters, allow_unused=True, retain_graph=True)
    assert all(g is None or not g.any() for g in forced)
    chosen = torch.autograd.grad(logp[0, 0], parameters, allow_unused=True)
    assert any(g is not None and g.any() for g in chosen)


def test_pushing_a_choice_down_moves_its_chance_to_the_other_listed_action(policy):
    """A row learned as a choice among two listed replies, with a negative advantage: the update
    lowers its chance and raises the other's by as much (they sum to 1), starting at ratio 1."""
    model, _ = policy
    prompt, replies = np.array([1, 5, 6, 9]), [np.array([7, 8]), np.array([11, 8])]
    offered = [np.array([[7, 11], [8, -1]]), np.array([[7, 11], [8, -1]])]

    def chances(m):
        with torch.no_grad():
            logp, _ = sequence_logprobs(m, [prompt] * 2, replies, 1.0, choice_ids=offered)
        return np.exp(logp.sum(1).numpy())

    before = chances(model)
    old = [np.array([np.log(before[0]), 0.0], dtype=np.float32)]
    batch = _rows_batch([prompt], replies[:1], old)
    batch.choice_ids = offered[:1]
    config = resolve(
        load_config(overrides=["rollout.temperature=1", "optim.epochs=1", "engine=hf", "optim.warmup_steps=0"])
    )
    copy_ = copy.deepcopy(model)
    learner = Learner(copy_, torch.optim.AdamW(copy_.parameters(), lr=1e-2), config, np.random.default_rng(0))
    with Progress(disable=True) as progress:
        metrics = learner.update(batch, np.array([-1.0]), progress)
    after = chances(copy_)
    assert metrics["update/ratio_min"] == pytest.approx(1.0, abs=1e-5)
    assert after[0] < before[0] - 1e-3 and after.sum() == pytest.approx(1.0, abs=1e-6)
    # The entropy logged is the choice's: of the two listed actions at the first token, 0 at the forced second.
    chosen = before[0]
    choice_entropy = -(chosen * np.log(chosen) + (1 - chosen) * np.log(1 - chosen))
    assert metrics["update/entropy"] == pytest.approx(choice_entropy / 2, rel=1e-4)


@pytest.mark.parametrize("loss", ["grpo", "gspo_token", "cispo", "drgrpo"])
def test_merging_repeated_rows_leaves_the_gradient_unchanged(loss):
    """A minibatch that repeats rows (same prompt and response, advantages of both signs) gets the
    gradient of the row-by-row sum of the policy loss, after one step has moved the ratios."""
    from agent_rl.config import LOSS_PRESETS
    from agent_rl.core.losses import policy_loss

    model = _tiny_model()
    rng = np.random.default_rng(5)
    base_prompts = [rng.integers(2, 40, size=6), rng.integers(2, 40, size=4)]
    base_responses = [rng.integers(2, 40, size=3), rng.integers(2, 40, size=2)]
    pick = [0, 0, 0, 1, 1, 0]
    prompts, responses = [base_prompts[i] for i in pick], [base_responses[i] for i in pick]
    advantages = np.array([0.5, -1.0, 0.25, 2.0, 1.0, -0.5])
    with torch.no_grad():
        logp, _ = sequence_logprobs(model, base_prompts, base_responses)
    # Old logprobs off the current ones, so ratios leave 1 and the clip acts; repeated rows share them.
    old = [logp[i, : len(base_responses[i])].numpy() - 0.3 * (1 - 2 * i) for i in pick]
    kwargs = {
        **{k: v for k, v in LOSS_PRESETS[loss].items() if k not in ("kl_coef", "kl_estimator")},
        "kl_coef": 0.0,
        "norm_length": 4 if LOSS_PRESETS[loss]["loss_agg"] == "seq_mean_token_sum_norm" else None,
    }
    model.zero_grad()
    metrics = accumulate_policy_gradient(
        model, prompts, responses, old, advantages, loss=LossSpec(**kwargs), temperature=1.0, micro_batch_size=8
    )
    merged = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert metrics["repeated_rows"] == 3  # rows 0 and 2 (positive), 1 and 5 (negative), 3 and 4 merge
    model.zero_grad()
    lengths = np.array([len(r) for r in responses])
    for i in range(len(prompts)):
        row_logp, mask = sequence_logprobs(model, [prompts[i]], [responses[i]])
        policy_loss(
            row_logp,
            torch.as_tensor(old[i])[None],
            torch.tensor([advantages[i]], dtype=torch.float32),
            mask,
            num_tokens=float(lengths.sum()),
            num_rows=float(len(lengths)),
            **kwargs,
        ).loss.backward()
    one_by_one = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert float((merged - one_by_one).norm() / one_by_one.norm()) < 1e-5


def _synthetic_rows(vocab: int, n: int, seed: int):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(8, vocab, size=rng.integers(4, 12)) for _ in range(n)]
    responses = [rng.integers(8, vocab, size=rng.integers(1, 5)) for _ in range(n)]
    return prompts, responses, rng.normal(size=n)


def test_minibatch_update_does_not_depend_on_the_micro_batch_split_and_moves_the_ratios(policy):
    """Two learners from the same weights run the same update (3 minibatches x 2 epochs) with
    different micro-batch sizes: every optimizer step sees the same minibatch gradient. The rows are
    on-policy for the first step only: the ratios must leave 1 afterwards and the clip act. (A small
    lr and GRPO's token clip: at lr 3e-4 one step moves these random rows so far that every later
    token is clipped and the later gradients are all zero.)"""
    model, _ = policy
    prompts, responses, advantages = _synthetic_rows(model.config.vocab_size, 9, seed=0)
    with torch.no_grad():
        logp, _ = sequence_logprobs(model, prompts, responses, 1.0)
    old = [row[: len(r)].numpy() for row, r in zip(logp, responses)]
    results, gradients = [], []
    for size in (1, 64):
        config = resolve(
            load_config(
                overrides=[
                    "optim.minibatches=3",
                    "optim.minibatch_size=0",
                    "optim.epochs=2",
                    "algo.loss=grpo",
                    "algo.kl_coef=0",
                    "optim.min_steps=0",
                    "optim.lr=1e-5",
                    f"optim.micro_batch_size={size}",
                    "engine=hf",
                ]
            )
        )
        copy_ = copy.deepcopy(model)
        optimizer = torch.optim.AdamW(copy_.parameters(), lr=config.optim.lr)
        seen, step = [], optimizer.step

        def record(*args, seen=seen, step=step, model=copy_, **kwargs):
            seen.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
            return step(*args, **kwargs)

        optimizer.step = record
        learner = Learner(copy_, optimizer, config, np.random.default_rng([0, 2]))
        with Progress(disable=True) as progress:
            results.append(learner.optimize(prompts, responses, old, advantages, progress))
        gradients.append(seen)
    assert len(gradients[0]) == len(gradients[1]) == 6
    for small, large in zip(*gradients):
        assert float(large.norm()) > 0
        assert float((small - large).norm() / large.norm()) < 1e-3
    for metrics in results:
        assert metrics["update/optimizer_steps"] == 6.0
        assert metrics["update/ratio_max"] > 1.0 + 1e-4 or metrics["update/ratio_min"] < 1.0 - 1e-4
        assert metrics["update/clip_frac"] > 0.0


def test_rows_with_zero_advantage_are_left_out_before_the_minibatch_split(policy):
    """Steps follow signal: a zero-advantage row has no gradient, so it is dropped before the rows are
    split, and the minibatch count is taken on the learnable rows (3 minibatches asked for, 2
    learnable rows: 2 steps of one row each, wherever the shuffle puts them)."""
    model, _ = policy
    prompts, responses, _ = _synthetic_rows(model.config.vocab_size, 3, seed=1)
    with torch.no_grad():
        logp, _ = sequence_logprobs(model, prompts, responses, 1.0)
    old = [row[: len(r)].numpy() for row, r in zip(logp, responses)]
    config = resolve(
        load_config(
            overrides=[
                "optim.minibatches=3",
                "rollout.temperature=1",
                "optim.minibatch_size=0",
                "optim.epochs=1",
                "algo.loss=grpo",
                "algo.kl_coef=0",
                "optim.min_steps=0",
                "engine=hf",
            ]
        )
    )
    for seed in range(4):
        copy_ = copy.deepcopy(model)
        learner = Learner(copy_, torch.optim.AdamW(copy_.parameters(), lr=0.0), config, np.random.default_rng(seed))
        with Progress(disable=True) as progress:
            metrics = learner.optimize(prompts, responses, old, np.array([0.0, 1.0, -1.0]), progress)
        assert metrics["update/optimizer_steps"] == 2.0 and metrics["update/learnable_rows"] == 2.0
        assert metrics["update/learnable_fraction"] == pytest.approx(2 / 3)
        assert metrics["update/active_rows"] == 1.0 and metrics["update/skipped"] == 0.0
        assert metrics["update/ratio_max"] == pytest.approx(1.0, abs=1e-5) and "update/clip_frac" in metrics
        assert metrics["update/first_step_approx_kl"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("target_kl, steps", [(None, 8), (1e9, 8), (1e-6, 1)])
def test_target_kl_stops_the_update_at_the_first_minibatch_past_it(policy, target_kl, steps):
    """4 epochs x 2 minibatches of on-policy rows: the first step always runs (its KL is ~0); after it,
    at lr 1e-2, the next minibatch's KL exceeds 1e-6, so that step and every later one is not taken,
    while a target it never reaches changes nothing."""
    model, _ = policy
    prompts, responses, _ = _synthetic_rows(model.config.vocab_size, 8, seed=5)
    with torch.no_grad():
        logp, _ = sequence_logprobs(model, prompts, responses, 1.0)
    old = [row[: len(r)].numpy() for row, r in zip(logp, responses)]
    overrides = ["optim.epochs=4", "optim.minibatches=2", "optim.minibatch_size=0", "optim.warmup_steps=0"]
    overrides += ["rollout.temperature=1", "algo.loss=grpo", "algo.kl_coef=0", "optim.min_steps=0", "engine=hf"]
    overrides.append(f"optim.target_kl={'null' if target_kl is None else target_kl}")
    config = resolve(load_config(overrides=overrides))
    trained = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    learner = Learner(trained, optimizer, config, np.random.default_rng(0))
    with Progress(disable=True) as progress:
        metrics = learner.optimize(prompts, responses, old, np.linspace(-1.0, 1.0, 8), progress)
    assert metrics["update/optimizer_steps"] == steps
    assert all(state["step"] == steps for state in optimizer.state.values())
    if target_kl is None:
        assert "update/kl_stopped" not in metrics
    else:
        assert metrics["update/kl_stopped"] == float(steps < 8)


@pytest.mark.parametrize("min_steps, epochs, steps", [(0, 1, 2), (2, 1, 2), (5, 3, 6), (6, 3, 6)])
def test_min_steps_raises_the_epochs_until_the_update_takes_that_many_steps(policy, min_steps, epochs, steps):
    """8 learnable trajectories in 2 minibatches a pass, 1 pass asked for: min_steps raises the passes
    to ceil(min_steps / 2), never lowers them."""
    model, _ = policy
    prompts, responses, _ = _synthetic_rows(model.config.vocab_size, 8, seed=5)
    overrides = ["optim.epochs=1", "optim.minibatches=2", "optim.minibatch_size=0", f"optim.min_steps={min_steps}"]
    config = resolve(load_config(overrides=[*overrides, "algo.loss=grpo", "algo.kl_coef=0", "engine=hf"]))
    trained = copy.deepcopy(model)
    learner = Learner(trained, torch.optim.AdamW(trained.parameters(), lr=1e-3), config, np.random.default_rng(0))
    old = [np.zeros(len(r), dtype=np.float32) for r in responses]
    with Progress(disable=True) as progress:
        metrics = learner.optimize(prompts, responses, old, np.linspace(-1.0, 1.0, 8), progress)
    assert metrics["update/optimizer_steps"] == steps
    assert metrics.get("update/epochs") == (float(epochs) if min_steps else None)


@pytest.mark.parametrize(
    "advantages, steps, epochs",
    [(np.linspace(-1.0, 1.0, 8), 6, 3), (np.array([-1.0, -0.5, 0.0, -0.25, -1.0, -2.0, -0.5, -0.1]), 2, 1)],
)
def test_extra_passes_on_positive_rows_learn_from_the_wins_alone(policy, monkeypatch, advantages, steps, epochs):
    """8 trajectories, 1 pass of 2 minibatches, min_steps 6: with extra_passes_on=positive the added
    passes hold only the rows with a positive advantage (4 of them: 2 minibatches a pass, 2 passes
    more), each pass all of them; a batch with no positive row gets no extra pass."""
    import agent_rl.training.loop.learner as learner_module

    model, _ = policy
    prompts, responses, _ = _synthetic_rows(model.config.vocab_size, 8, seed=5)
    overrides = ["optim.epochs=1", "optim.minibatches=2", "optim.minibatch_size=0", "optim.min_steps=6"]
    overrides += ["optim.extra_passes_on=positive", "algo.loss=grpo", "algo.kl_coef=0", "engine=hf"]
    config = resolve(load_config(overrides=overrides))
    seen = []
    real = learner_module.accumulate_policy_gradient
    monkeypatch.setattr(
        learner_module, "accumulate_policy_gradient", lambda *a, **k: (seen.append(a[4].copy()), real(*a, **k))[1]
    )
    trained = copy.deepcopy(model)
    learner = Learner(trained, torch.optim.AdamW(trained.parameters(), lr=1e-3), config, np.random.default_rng(0))
    old = [np.zeros(len(r), dtype=np.float32) for r in responses]
    with Progress(disable=True) as progress:
        metrics = learner.optimize(prompts, responses, old, advantages, progress)
    assert metrics["update/optimizer_steps"] == steps and metrics["update/epochs"] == epochs
    learnable = np.sort(advantages[advantages != 0])
    assert np.array_equal(np.sort(np.concatenate(seen[:2])), learnable)  # the first pass: every learnable row
    for extra_pass in (seen[2:4], seen[4:6])[: (steps - 2) // 2]:
        assert np.array_equal(np.sort(np.concatenate(extra_pass)), np.sort(advantages[advantages > 0]))


@pytest.mark.parametrize("key, value", [("target_kl", 0), ("target_kl", -0.1), ("min_steps", -1)])
def test_a_target_kl_that_is_not_positive_and_negative_min_steps_are_config_errors(key, value):
    from agent_rl.config import ConfigError

    with pytest.raises(ConfigError, match=f"optim.{key}"):
        load_config(overrides=[f"optim.{key}={value}"])


def test_a_batch_with_no_advantage_takes_no_step(policy):
    model, _ = policy
    prompts, responses, _ = _synthetic_rows(model.config.vocab_size, 4, seed=3)
    config = resolve(load_config(overrides=["algo.loss=grpo", "algo.kl_coef=0", "engine=hf"]))
    trained = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    learner = Learner(trained, optimizer, config, np.random.default_rng(0))
    old = [np.zeros(len(r), dtype=np.float32) for r in responses]
    with Progress(disable=True) as progress:
        metrics = learner.optimize(prompts, responses, old, np.zeros(4), progress)
    assert metrics == {
        "update/skipped": 1.0,
        "update/optimizer_steps": 0.0,
        "update/learnable_rows": 0.0,
        "update/learnable_fraction": 0.0,
        "update/forwarded_tokens": 0.0,
    }
    assert learner.steps_taken == 0 and not optimizer.state
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), trained.parameters()))


@pytest.mark.parametrize("poison", [float("inf"), float("nan")])
def test_a_step_with_a_non_finite_gradient_is_skipped_and_counted(policy, poison):
    model, _ = policy
    prompts, responses, _ = _synthetic_rows(model.config.vocab_size, 4, seed=3)
    config = resolve(
        load_config(
            overrides=[
                "algo.loss=grpo",
                "algo.kl_coef=0",
                "optim.min_steps=0",
                "engine=hf",
                "optim.minibatch_size=0",
                "optim.minibatches=1",
                "optim.epochs=2",
            ]
        )
    )
    trained = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    learner = Learner(trained, optimizer, config, np.random.default_rng(0))
    old = [np.zeros(len(r), dtype=np.float32) for r in responses]
    # One weight's gradient is poisoned: the clipped norm is not finite and AdamW would spread it.
    hook = next(trained.parameters()).register_hook(lambda grad: grad * poison)
    with Progress(disable=True) as progress:
        metrics = learner.optimize(prompts, responses, old, np.array([1.0, -1.0, 0.5, -0.5]), progress)
    assert metrics["update/nonfinite_steps"] == 2.0 and metrics["update/optimizer_steps"] == 0.0
    assert metrics["update/skipped"] == 1.0
    assert learner.steps_taken == 0 and not optimizer.state
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), trained.parameters()))
    hook.remove()  # the next update is clean again and steps
    with Progress(disable=True) as progress:
        metrics = learner.optimize(prompts, responses, old, np.array([1.0, -1.0, 0.5, -0.5]), progress)
    assert metrics["update/nonfinite_steps"] == 0.0 and metrics["update/optimizer_steps"] == 2.0
    assert all(torch.isfinite(p).all() for p in trained.parameters())


def test_a_rank_dealt_no_row_of_a_minibatch_still_steps_with_the_others(policy, monkeypatch):
    # Rank 1 of 2 with one learnable row: rank 0 forwards it; rank 1 forwards nothing, and must still
    # join the gradient sum and the step (here the sum is stubbed: no process group in a unit test).
    import agent_rl.training.loop.learner as learner_module
    from agent_rl.training.infra.distributed import DistContext

    model, _ = policy
    prompts, responses, _ = _synthetic_rows(model.config.vocab_size, 2, seed=3)
    config = resolve(load_config(overrides=["algo.loss=grpo", "algo.kl_coef=0", "optim.min_steps=0", "engine=hf"]))
    reduced = []
    monkeypatch.setattr(learner_module, "all_reduce_gradients", lambda params, dist: reduced.append(dist.rank))
    trained = copy.deepcopy(model)
    learner = Learner(
        trained, torch.optim.AdamW(trained.parameters(), lr=1e-2), config, np.random.default_rng(0), DistContext(1, 2)
    )
    old = [np.zeros(len(r), dtype=np.float32) for r in responses]
    with Progress(disable=True) as progress:
        metrics = learner.optimize(prompts, responses, old, np.array([1.0, 0.0]), progress)
    assert reduced == [1] * config.optim.epochs  # one gradient sum per minibatch, as on rank 0
    assert metrics["update/optimizer_steps"] == config.optim.epochs and metrics["update/active_rows"] == 0.0
    assert metrics["update/loss"] == 0.0 and metrics["update/forwarded_tokens"] == 0.0


def test_every_rank_stops_where_rank_zero_finds_the_target_kl_passed(policy, monkeypatch):
    # Rank 1 of 2, whose own KL never passes the target; rank 0's does at the third minibatch (the
    # broadcast is stubbed): rank 1 asks from the second minibatch on and stops with rank 0.
    import agent_rl.training.loop.learner as learner_module
    from agent_rl.training.infra.distributed import DistContext

    model, _ = policy
    prompts, responses, _ = _synthetic_rows(model.config.vocab_size, 4, seed=3)
    overrides = ["optim.epochs=4", "optim.minibatches=2", "optim.minibatch_size=0", "optim.target_kl=1e9"]
    config = resolve(load_config(overrides=[*overrides, "algo.loss=grpo", "algo.kl_coef=0", "engine=hf"]))
    reduced, asked = [], []
    monkeypatch.setattr(learner_module, "all_reduce_gradients", lambda params, dist: reduced.append(dist.rank))

    def rank_zero_says(passed: bool, dist) -> bool:
        asked.append(passed)
        return len(asked) == 2

    monkeypatch.setattr(learner_module, "broadcast_flag", rank_zero_says)
    trained = copy.deepcopy(model)
    learner = Learner(
        trained, torch.optim.AdamW(trained.parameters(), lr=1e-2), config, np.random.default_rng(0), DistContext(1, 2)
    )
    old = [np.zeros(len(r), dtype=np.float32) for r in responses]
    with Progress(disable=True) as progress:
        metrics = learner.optimize(prompts, responses, old, np.array([1.0, -1.0, 0.5, -0.5]), progress)
    assert asked == [False, False] and reduced == [1, 1]
    assert metrics["update/optimizer_steps"] == 2.0 and metrics["update/kl_stopped"] == 1.0


def test_warmup_raises_the_learning_rate_linearly_then_holds_it():
    assert [warmup_lr(step, 1e-3, 4) for step in (1, 2, 4, 5, 100)] == pytest.approx([2.5e-4, 5e-4, 1e-3, 1e-3, 1e-3])
    assert warmup_lr(1, 1e-3, 0) == 1e-3


def test_the_warmup_counts_optimizer_steps_across_updates_and_a_restored_optimizer(policy):
    """Each optimizer step uses the warmed-up rate of its own index, counted by AdamW's state, so an
    update that resumes (a restored optimizer) goes on where the last one stopped."""
    model, _ = policy
    prompts, responses, _ = _synthetic_rows(model.config.vocab_size, 4, seed=2)
    with torch.no_grad():
        logp, _ = sequence_logprobs(model, prompts, responses, 1.0)
    old = [row[: len(r)].numpy() for row, r in zip(logp, responses)]
    config = resolve(
        load_config(
            overrides=[
                "optim.minibatches=2",
                "optim.minibatch_size=0",
                "optim.epochs=1",
                "optim.lr=1e-3",
                "optim.warmup_steps=5",
                "algo.loss=grpo",
                "algo.kl_coef=0",
                "optim.min_steps=0",
                "engine=hf",
            ]
        )
    )
    trained = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=config.optim.lr)
    rates = []
    step = optimizer.step
    optimizer.step = lambda: (rates.append(optimizer.param_groups[0]["lr"]), step())[1]
    learner = Learner(trained, optimizer, config, np.random.default_rng(0))
    advantages = np.array([1.0, -1.0, 0.5, -0.5])
    with Progress(disable=True) as progress:
        logged = [learner.optimize(prompts, responses, old, advantages, progress)["update/lr"] for _ in range(2)]
    assert rates == pytest.approx([2e-4, 4e-4, 6e-4, 8e-4]) and learner.steps_taken == 4
    assert logged == pytest.approx([3e-4, 7e-4])  # the mean over each update's steps
    restored = torch.optim.AdamW(trained.parameters(), lr=config.optim.lr)
    restored.load_state_dict(optimizer.state_dict())
    resumed = Learner(trained, restored, config, np.random.default_rng(0))
    with Progress(disable=True) as progress:
        resumed.optimize(prompts, responses, old, advantages, progress)
    assert resumed.steps_taken == 6 and restored.param_groups[0]["lr"] == pytest.approx(1e-3)


# ---- micro-batch invariance -----------------------------------------------------------------------------


def _tiny_model(sliding_window: int | None = None):
    """A 2-layer Qwen2, its layers sliding-window ones when ``sliding_window`` is set."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        use_sliding_window=sliding_window is not None,
        sliding_window=sliding_window,
        max_window_layers=0,
    )
    return Qwen2ForCausalLM(config).eval()


@pytest.mark.parametrize("loss", ["grpo", "dapo", "drgrpo", "gspo", "gspo_token", "cispo"])
def test_gradient_does_not_depend_on_micro_batch_split(loss):
    from agent_rl.config import LOSS_PRESETS

    model = _tiny_model()
    rng = np.random.default_rng(0)
    n = 7
    # Two tasks behind one system prompt: micro-batches forward shared prefixes once.
    system, tasks = [1, 2, 3], [[4, 5, 6, 7], [8, 9]]
    prompts = [np.array(system + tasks[i % 2] + list(rng.integers(3, 40, size=rng.integers(1, 6)))) for i in range(n)]
    responses = [rng.integers(3, 40, size=rng.integers(1, 6)) for _ in range(n)]
    old = [rng.normal(-2.5, 0.3, size=len(r)).astype(np.float32) for r in responses]
    advantages = rng.normal(size=n)
    advantages[[1, 4]] = 0.0  # zero-advantage rows are skipped but still count in the normalizers
    kwargs = {**LOSS_PRESETS[loss], "kl_coef": 0.0}
    if kwargs["loss_agg"] == "seq_mean_token_sum_norm":
        kwargs["norm_length"] = 8

    def gradient(micro_batch_size: int) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        accumulate_policy_gradient(
            model,
            prompts,
            responses,
            old,
            advantages,
            loss=LossSpec(**kwargs),
            temperature=1.0,
            micro_batch_size=micro_batch_size,
        )
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    whole, split_one, split_three = gradient(n), gradient(1), gradient(3)
    assert whole.abs().sum() > 0
    torch.testing.assert_close(split_one, whole, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(split_three, whole, rtol=1e-4, atol=1e-7)

    # The same gradient as the plain full-batch loss over every row (zero-advantage rows included).
    from agent_rl.core.losses import policy_loss

    model.zero_grad(set_to_none=True)
    logp, mask = sequence_logprobs(model, prompts, responses)
    old_padded = torch.zeros_like(logp)
    for i, row in enumerate(old):
        old_padded[i, : len(row)] = torch.as_tensor(row)
    policy_loss(logp, old_padded, torch.as_tensor(advantages, dtype=torch.float32), mask, **kwargs).loss.backward()
    reference = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    torch.testing.assert_close(whole, reference, rtol=1e-4, atol=1e-7)


def test_forwarded_tokens_count_shared_prefixes_once_and_padding():
    from agent_rl.config import LOSS_PRESETS

    model = _tiny_model()
    prompts = [np.array([1, 2, 3, 4]), np.array([1, 2, 5]), np.array([6, 7])]
    responses = [np.array([8, 9]), np.array([10]), np.array([11, 12, 13])]
    old = [np.full(len(r), -2.0, dtype=np.float32) for r in responses]
    kwargs = {**LOSS_PRESETS["grpo"], "kl_coef": 0.0}

    def forwarded(advantages, micro_batch_size):
        return accumulate_policy_gradient(
            model,
            prompts,
            responses,
            old,
            np.array(advantages),
            loss=LossSpec(**kwargs),
            temperature=1.0,
            micro_batch_size=micro_batch_size,
        )["forwarded_tokens"]

    # The first two share [1, 2]: forwarded once, then 2 distinct rests of 2 prompt tokens, then 2
    # rows x 1 response token (the last response token predicts nothing).
    assert forwarded([1.0, -1.0, 0.0], 3) == 2 + 2 * 2 + 2 * 1
    # With the third row, the plan keeps the two apart from it (8 + 4 tokens), cheaper than one
    # micro-batch padding all three to 4 prompt tokens and 2 response tokens (12 + 6).
    assert forwarded([1.0, -1.0, 0.5], 3) == 8 + (2 + 2)
    # One row per micro-batch: each row's own length less one; a zero-advantage row is not forwarded.
    assert forwarded([1.0, 0.0, 0.5], 1) == (4 + 1) + (2 + 2)
    # A row repeating the first row's prompt (another reply to it) adds only its response.
    prompts.append(prompts[0])
    responses.append(np.array([12, 13]))
    old.append(np.full(2, -2.0, dtype=np.float32))
    assert forwarded([1.0, -1.0, 0.0, 0.5], 4) == 2 + 2 * 2 + 3 * 1


def _length_plan(prompts, responses, rows, size):
    order = rows[np.argsort([len(prompts[i]) + len(responses[i]) for i in rows], kind="stable")]
    return np.split(order, np.arange(size, len(order), size))


def _tokens(plan, prompts, responses):
    """Forwarded tokens, counted row by row: the micro-batch's shared prefix once, each distinct rest of
    a prompt once, padded, and every response but its last token, padded."""
    total = 0
    for batch in plan:
        shared = 0
        if len(batch) > 1:
            first = prompts[batch[0]]
            shared = min(
                min(
                    next(
                        (k for k, (a, b) in enumerate(zip(first, prompts[i])) if a != b),
                        min(len(first), len(prompts[i])),
                    )
                    for i in batch
                ),
                min(len(prompts[i]) for i in batch) - 1,
            )
        distinct = len({tuple(prompts[i][shared:]) for i in batch})
        rest = max(len(prompts[i]) for i in batch) - shared
        total += shared + distinct * rest + len(batch) * (max(len(responses[i]) for i in batch) - 1)
    return total


def test_micro_batch_plan_keeps_each_task_together_sorted_by_length():
    system = [1, 2, 3]
    task_a, task_b = [10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25]
    prompts = [np.array(system + (task_a if i % 2 else task_b) + [30] * (i % 5)) for i in range(12)]
    responses = [np.array([7] * (1 + i % 3)) for i in range(12)]
    plan = plan_micro_batches(prompts, responses, np.arange(12), size=4)
    assert sorted(np.concatenate(plan).tolist()) == list(range(12))
    assert [len(b) for b in plan] == [4, 2, 4, 2]  # no micro-batch spans the two tasks
    for batch in plan:
        assert len({i % 2 for i in batch}) == 1
        totals = [len(prompts[i]) + len(responses[i]) for i in batch]
        assert totals == sorted(totals)
    assert _tokens(plan, prompts, responses) < _tokens(
        _length_plan(prompts, responses, np.arange(12), 4), prompts, responses
    )


def test_micro_batch_plan_sorts_by_length_when_prompts_share_nothing():
    prompts = [np.array([i + 1] + [5] * (i % 4)) for i in range(9)]
    responses = [np.array([7, 8]) for _ in range(9)]
    rows = np.array([0, 2, 3, 5, 6, 8])
    plan = plan_micro_batches(prompts, responses, rows, size=4)
    assert [b.tolist() for b in plan] == [b.tolist() for b in _length_plan(prompts, responses, rows, 4)]
    assert plan_micro_batches(prompts, responses, np.array([3]), size=4)[0].tolist() == [3]
    assert plan_micro_batches(prompts, responses, np.array([], dtype=np.int64), size=4) == []


@settings(max_examples=60, deadline=None)
@given(
    prefixes=st.lists(st.lists(st.integers(1, 6), min_size=0, max_size=6), min_size=1, max_size=4),
    rows=st.lists(
        st.tuples(st.integers(0, 3), st.lists(st.integers(1, 6), max_size=5), st.integers(1, 4)),
        min_size=1,
        max_size=30,
    ),
    size=st.integers(1, 7),
)
def test_micro_batch_plan_is_a_partition_that_forwards_no_more_than_sorting_by_length(prefixes, rows, size):
    prompts = [np.array([9, *prefixes[k % len(prefixes)], *tail]) for k, tail, _ in rows]
    responses = [np.array([1] * n) for _, _, n in rows]
    picked = np.arange(len(rows))[::-1]
    plan = plan_micro_batches(prompts, responses, picked, size)
    assert sorted(np.concatenate(plan).tolist()) == sorted(picked.tolist())
    assert all(1 <= len(batch) <= size for batch in plan)
    assert _tokens(plan, prompts, responses) <= _tokens(
        _length_plan(prompts, responses, picked, size), prompts, responses
    )


# ---- the rest of the learner ------------------------------------------------------------------------------


def _rows_batch(prompts, responses, old):
    n = len(prompts)
    return StepBatch(
        group_id=np.zeros(n),
        traj_id=np.arange(n),
        t=np.zeros(n),
        reward=np.zeros(n),
        done=np.ones(n),
        truncated=np.zeros(n),
        action_valid=np.ones(n),
        won=np.zeros(n),
        overlong=np.zeros(n),
        prompt_ids=prompts,
        response_ids=responses,
        old_logprobs=old,
        observation=[""] * n,
        error=[None] * n,
        action=[""] * n,
        anchor_state=[""] * n,
    )


def test_recomputed_logprobs_are_the_models_and_the_mismatch_is_measured():
    model = _tiny_model()
    prompts, responses, _ = _synthetic_rows(40, 6, seed=1)
    with torch.no_grad():
        logp, _ = sequence_logprobs(model, prompts, responses)
    exact = [row[: len(r)].numpy().astype(np.float32) for row, r in zip(logp, responses)]
    engine = [values - 0.25 for values in exact]
    recomputed, metrics = recompute_logprobs(
        model, _rows_batch(prompts, responses, engine), micro_batch_size=2, temperature=1.0
    )
    for got, want in zip(recomputed, exact):
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert metrics["update/logprob_mismatch_mean"] == pytest.approx(0.25, abs=1e-4)
    assert metrics["update/logprob_mismatch_max"] == pytest.approx(0.25, abs=1e-4)
    # Only the asked rows are rescored; an explored row (placeholder zeros) leaves the mismatch out.
    engine[1] = engine[1] - 0.75
    engine[3] = np.zeros_like(exact[3])
    batch = _rows_batch(prompts, responses, engine)
    batch.extras["explored"] = np.array([False, False, False, True, False, False])
    rows = np.array([True, True, False, True, False, False])
    recomputed, metrics = recompute_logprobs(model, batch, micro_batch_size=2, temperature=1.0, rows=rows)
    for i in range(6):
        np.testing.assert_allclose(recomputed[i], exact[i] if rows[i] else engine[i], atol=1e-5)
    n0, n1 = len(exact[0]), len(exact[1])  # rows 0 and 1: off by 0.25 and 1.0
    assert metrics["update/logprob_mismatch_mean"] == pytest.approx((0.25 * n0 + 1.0 * n1) / (n0 + n1), abs=1e-4)
    assert metrics["update/logprob_mismatch_max"] == pytest.approx(1.0, abs=1e-4)
    _, metrics = recompute_logprobs(model, batch, 2, 1.0, rows=batch.extras["explored"])
    assert metrics == {}  # nothing the engine sampled was rescored
    # A greedy row's logprobs are greedy decoding's, not the sampling temperature's: left out alike.
    batch.extras["greedy"] = np.array([False, True, False, False, False, False])
    _, metrics = recompute_logprobs(model, batch, micro_batch_size=2, temperature=1.0, rows=rows)
    assert metrics["update/logprob_mismatch_max"] == pytest.approx(0.25, abs=1e-4)  # row 0 alone
    np.testing.assert_array_equal(unsampled_rows(batch), [False, True, False, True, False, False])


@pytest.mark.parametrize("flag", ["explored", "greedy"])
def test_the_update_scores_explored_and_greedy_rows_with_its_own_weights(policy, flag):
    """An explored row's placeholder logprobs (zeros), or a greedy row's, never reach the ratio: with
    lr 0 the first step's ratios are exactly 1 and its KL 0, as for rows the engine sampled."""
    model, _ = policy
    prompts, responses, _ = _synthetic_rows(model.config.vocab_size, 4, seed=3)
    with torch.no_grad():
        logp, _ = sequence_logprobs(model, prompts, responses, 1.0)
    old = [row[: len(r)].numpy() for row, r in zip(logp, responses)]
    old[2] = np.zeros_like(old[2])
    batch = _rows_batch(prompts, responses, old)
    overrides = ["rollout.temperature=1", "optim.epochs=1", "algo.loss=grpo", "algo.kl_coef=0", "engine=hf"]
    config = resolve(load_config(overrides=[*overrides, "optim.min_steps=0"]))
    for explored in (True, False):
        batch.extras[flag] = np.array([False, False, explored, False])
        copy_ = copy.deepcopy(model)
        learner = Learner(copy_, torch.optim.AdamW(copy_.parameters(), lr=0.0), config, np.random.default_rng(0))
        with Progress(disable=True) as progress:
            metrics = learner.update(batch, np.array([1.0, -1.0, 1.0, -1.0]), progress)
        if explored:
            assert metrics["update/first_step_approx_kl"] == pytest.approx(0.0, abs=1e-6)
            assert metrics["update/ratio_min"] == pytest.approx(1.0, abs=1e-5)
        else:  # without the flag the zeros are taken for the engine's logprobs: ratio exp(logp) < 1
            assert metrics["update/ratio_min"] < 1.0 - 1e-3


def test_an_update_without_rows_learns_nothing():
    model = _tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    learner = Learner(
        model,
        torch.optim.AdamW(model.parameters(), lr=1e-2),
        resolve(load_config(overrides=["engine=hf"])),
        np.random.default_rng(0),
    )
    with Progress(disable=True) as progress:
        assert learner.update(None, None, progress) == {}
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_the_kl_reference_is_a_frozen_copy_of_the_given_weights(tmp_path):
    model = _tiny_model()
    model.save_pretrained(tmp_path / "sft")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    learner = Learner(
        model,
        torch.optim.AdamW(model.parameters()),
        resolve(load_config(overrides=["engine=hf"])),
        np.random.default_rng(0),
    )
    learner.freeze_reference(tmp_path / "sft")
    saved = _tiny_model()  # the same seed: the weights that were saved
    for ours, theirs, current in zip(learner.reference.parameters(), saved.parameters(), model.parameters()):
        assert torch.equal(ours, theirs) and not torch.equal(ours, current) and not ours.requires_grad
    learner.freeze_reference()
    assert all(torch.equal(a, b) for a, b in zip(learner.reference.parameters(), model.parameters()))


@pytest.mark.parametrize("overrides, clamp", [([], 10.0), (["algo.kl_clamp=2.5"], 2.5), (["algo.kl_clamp=null"], None)])
def test_the_learner_carries_the_kl_settings_of_its_config(overrides, clamp):
    model = _tiny_model()
    config = resolve(load_config(overrides=["engine=hf", "algo.kl_coef=0.05", *overrides]))
    learner = Learner(model, torch.optim.AdamW(model.parameters()), config, np.random.default_rng(0))
    assert (learner.loss.kl_coef, learner.loss.kl_estimator, learner.loss.kl_clamp) == (0.05, "k3", clamp)
