"""agent_rl.core.losses: each term by hand, GSPO forms against each other, presets and validation."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_rl.core.losses import (
    LOSS_PRESETS,
    LossSpec,
    aggregate,
    cispo_surrogate,
    clipped_surrogate,
    combine_loss_metrics,
    kl_penalty,
    log_importance_weights,
    policy_loss,
)


@pytest.fixture(autouse=True)
def float64_default():
    """Hand-computed values are compared in float64; restore the default for other modules."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _inputs(log_ratios, old=-1.0):
    """logp/old_logp with the given per-token log ratios (B, T)."""
    log_ratios = torch.tensor(log_ratios)
    old_logp = torch.full_like(log_ratios, old)
    logp = (old_logp + log_ratios).clone().requires_grad_(True)
    return logp, old_logp


# ---- terms -----------------------------------------------------------------------------------------
def test_clipped_surrogate_by_hand():
    ratio = torch.tensor([1.25, 1.25, 0.7, 0.7, 1.0])
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0, 2.0])
    loss, clipped = clipped_surrogate(ratio, adv, 0.2, 0.2)
    # 1.25*A=1.25 vs 1.2 -> min 1.2 (clipped); A=-1: -1.25 vs -1.2 -> -1.25; 0.7,A=-1: -0.7 vs -0.8 -> -0.8
    torch.testing.assert_close(loss, torch.tensor([-1.2, 1.25, 0.8, -0.7, -2.0]))
    assert clipped.tolist() == [True, False, True, False, False]
    # DAPO clip-higher: 1.25 lies inside [0.8, 1.28], so nothing is clipped for A > 0.
    loss, clipped = clipped_surrogate(ratio, adv, 0.2, 0.28)
    torch.testing.assert_close(loss[0], torch.tensor(-1.25))
    assert not clipped[0]
    # No clip: REINFORCE form.
    loss, clipped = clipped_surrogate(ratio, adv, None, None)
    torch.testing.assert_close(loss, -ratio * adv)
    assert not clipped.any()


def test_cispo_value_and_gradient():
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    old = torch.tensor([-1.5, -1.0])
    ratio = torch.exp(logp - old)  # e^0.5 = 1.6487, e^-1 = 0.3679
    adv = torch.tensor([2.0, -1.0])
    loss, capped = cispo_surrogate(ratio, adv, logp, cap=1.5)
    torch.testing.assert_close(loss.detach(), torch.tensor([-1.5 * 2.0 * -1.0, -math.exp(-1) * -1.0 * -2.0]))
    assert capped.tolist() == [True, False]
    loss.sum().backward()
    # d/dlogp of -sg(w) * A * logp = -w * A: the capped token still gets a gradient.
    torch.testing.assert_close(logp.grad, torch.tensor([-1.5 * 2.0, math.exp(-1) * 1.0]))


def test_kl_estimators_by_hand():
    logp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.5, -2.0])  # d = 0.5, 0
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), torch.tensor([0.5, 0.0]))
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), torch.tensor([0.125, 0.0]))
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), torch.tensor([math.exp(-0.5) + 0.5 - 1, 0.0]))
    with pytest.raises(ValueError, match="kl_estimator"):
        kl_penalty(logp, ref, "k4")


def verl_low_var_kl(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """verl's ``kl_penalty(..., "low_var_kl")`` (verl/trainer/ppo/core_algos.py), ported."""
    kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


def test_clamped_k3_by_hand_bounds_the_value_and_drops_the_gradient_beyond_it():
    ref = torch.tensor([-2.0, -1.0, -1.0, -1.0])
    logp = torch.tensor([-1.0, -6.0, -1.0, -30.0], requires_grad=True)  # d = 1, -5, 0, -29
    unclamped = kl_penalty(logp, ref, "k3")
    torch.testing.assert_close(
        unclamped.detach(), torch.tensor([math.exp(-1.0), math.exp(5.0) - 6.0, 0.0, math.exp(29.0) - 30.0])
    )
    clamped = kl_penalty(logp, ref, "k3", clamp=10.0)
    torch.testing.assert_close(clamped.detach(), torch.tensor([math.exp(-1.0), 10.0, 0.0, 10.0]))
    (grad,) = torch.autograd.grad(clamped.sum(), logp)
    # d k3 / d logp = 1 - exp(-d): kept below the bound, 0 beyond it.
    torch.testing.assert_close(grad, torch.tensor([1.0 - math.exp(-1.0), 0.0, 0.0, 0.0]))
    (grad,) = torch.autograd.grad(unclamped.sum(), logp)
    assert float(grad[1]) == pytest.approx(1.0 - math.exp(5.0))  # the token far below ref dominates
    # k1 and k2 are never clamped.
    torch.testing.assert_close(kl_penalty(logp, ref, "k2", clamp=10.0), kl_penalty(logp, ref, "k2"))


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(-60, 0), min_size=1, max_size=16),
    st.lists(st.floats(-60, 0), min_size=1, max_size=16),
)
def test_clamped_k3_is_verls_low_var_kl(logps, refs):
    n = min(len(logps), len(refs))
    logp, ref = torch.tensor(logps[:n], dtype=torch.float64), torch.tensor(refs[:n], dtype=torch.float64)
    torch.testing.assert_close(kl_penalty(logp, ref, "k3", clamp=10.0), verl_low_var_kl(logp, ref))


def test_policy_loss_bounds_its_kl_term_with_kl_clamp():
    mask = torch.ones(1, 2, dtype=torch.bool)
    old = torch.tensor([[-1.0, -1.0]])
    ref = torch.tensor([[-1.0, -1.0]])
    grads = {}
    for clamp in (10.0, None):
        logp = torch.tensor([[-1.0, -9.0]], requires_grad=True)  # the second token 8 nats below ref
        out = policy_loss(logp, old, torch.zeros(1), mask, ref_logp=ref, kl_coef=0.1, kl_estimator="k3", kl_clamp=clamp)
        out.loss.backward()
        grads[clamp] = logp.grad[0, 1].item()
        assert out.metrics["kl_ref"] == pytest.approx((10.0 if clamp else math.exp(8.0) - 9.0) / 2)
    # Mean over two tokens, kl_coef 0.1: 0.1 * (1 - e^8) / 2 unclamped; nothing past the bound.
    assert grads[None] == pytest.approx(0.1 * (1.0 - math.exp(8.0)) / 2, rel=1e-5) and grads[10.0] == 0.0
    with pytest.raises(ValueError, match="kl_clamp must be > 0 or None"):
        policy_loss(logp, old, torch.zeros(1), mask, ref_logp=ref, kl_coef=0.1, kl_clamp=0.0)


def test_k3_is_unbiased_for_kl():
    # E_{x~p}[k3] = KL(p || q) for categorical p, q.
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.5, 0.3])
    expected_kl = float((p * (p / q).log()).sum())
    k3 = kl_penalty(p.log(), q.log(), "k3")
    k1 = kl_penalty(p.log(), q.log(), "k1")
    assert float((p * k3).sum()) == pytest.approx(expected_kl)
    assert float((p * k1).sum()) == pytest.approx(expected_kl)


def test_aggregation_modes_by_hand():
    token_loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]]).bool()
    # Row means 2 and 4; the empty row contributes nothing.
    assert float(aggregate(token_loss, mask, "seq_mean_token_mean")) == pytest.approx(3.0)
    assert float(aggregate(token_loss, mask, "token_mean")) == pytest.approx(10.0 / 4.0)
    assert float(aggregate(token_loss, mask, "seq_mean_token_sum_norm")) == pytest.approx(10.0 / (3 * 3))
    assert float(aggregate(token_loss, mask, "seq_mean_token_sum_norm", norm_length=5)) == pytest.approx(10.0 / 15)
    with pytest.raises(ValueError, match="loss_agg"):
        aggregate(token_loss, mask, "sum")


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 8),
    st.integers(1, 6),
    st.integers(0, 2**31 - 1),
    st.sampled_from(["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]),
)
def test_micro_batches_sum_to_the_full_batch(rows, length, seed, loss_agg):
    gen = torch.Generator().manual_seed(seed)
    token_loss = torch.randn(rows, length, generator=gen)
    mask = torch.rand(rows, length, generator=gen) < 0.6
    full = aggregate(token_loss, mask, loss_agg)
    split = rows // 2
    num_tokens = float(mask.sum())
    num_rows = float((mask.sum(-1) > 0).sum()) if loss_agg == "seq_mean_token_mean" else float(rows)
    parts = sum(
        aggregate(token_loss[s], mask[s], loss_agg, num_tokens=num_tokens, num_rows=num_rows, norm_length=length)
        for s in (slice(0, split), slice(split, rows))
    )
    torch.testing.assert_close(parts, full)


def test_sequence_ratio_is_exp_of_masked_mean_log_ratio():
    logp, old = _inputs([[0.1, 0.3, 5.0], [0.2, 0.2, 0.2]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]]).bool()
    log_w = log_importance_weights(logp, old, mask, "sequence")
    torch.testing.assert_close(log_w[:, 0], torch.tensor([0.2, 0.2]))
    token = log_importance_weights(logp, old, mask, "token")
    torch.testing.assert_close(token[0], torch.tensor([0.1, 0.3, 0.0]))


# ---- the composed loss -------------------------------------------------------------------------------
def test_grpo_token_loss_by_hand():
    logp, old = _inputs([[0.0, math.log(1.5)], [math.log(0.5), 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]]).bool()
    adv = torch.tensor([1.0, -2.0])
    out = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    # Row 0: tokens -1*1, -min(1.5, 1.2)=-1.2 -> mean -1.1. Row 1: -min(0.5*-2, 0.8*-2) = 1.6.
    assert out.loss.item() == pytest.approx((-1.1 + 1.6) / 2)
    assert out.metrics["clip_frac"] == pytest.approx(2 / 3)
    assert out.metrics["ratio_max"] == pytest.approx(1.5)
    assert out.metrics["ratio_min"] == pytest.approx(0.5)
    out.loss.backward()
    # Gradient of -rho*A/count wrt logp is -rho*A/count where unclipped, 0 where clipped.
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5 / 2, 0.0], [0.0, 0.0]]))


def test_gspo_sequence_and_sequence_token_agree_with_one_advantage_per_sequence():
    torch.manual_seed(0)
    base_logp = torch.randn(3, 5) * 0.05 - 1.0
    old = base_logp + torch.randn(3, 5) * 0.01
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]).bool()
    adv = torch.tensor([1.0, -0.5, 2.0])
    results = []
    for level in ("sequence", "sequence_token"):
        logp = base_logp.clone().requires_grad_(True)
        out = policy_loss(logp, old, adv, mask, ratio_level=level, clip_low=3e-4, clip_high=4e-4)
        out.loss.backward()
        results.append((out.loss.detach(), logp.grad.clone()))
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])


def test_gspo_token_uses_per_token_advantages():
    logp, old = _inputs([[0.0, 0.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    out = policy_loss(
        logp, old, torch.tensor([[1.0, -1.0]]), mask, ratio_level="sequence_token", clip_low=None, clip_high=None
    )
    out.loss.backward()
    # ratio value 1, gradient s_i * grad logp_t: -A_t / 2 per token.
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5, 0.5]]))


def test_kl_is_added_per_token_before_aggregation():
    logp, old = _inputs([[0.0, 0.0]])
    ref = old - torch.tensor([[0.5, 0.0]])  # d = 0.5, 0
    mask = torch.ones(1, 2, dtype=torch.bool)
    out = policy_loss(logp, old, torch.zeros(1), mask, ref_logp=ref, kl_coef=0.1, kl_estimator="k2")
    assert out.loss.item() == pytest.approx(0.1 * 0.125 / 2)
    assert out.metrics["kl_ref"] == pytest.approx(0.125 / 2)
    with pytest.raises(ValueError, match="needs ref_logp"):
        policy_loss(logp, old, torch.zeros(1), mask, kl_coef=0.1)


def test_empty_masks_give_zero_loss_and_finite_gradients():
    logp, old = _inputs([[0.3, -0.2], [0.1, 0.0]])
    mask = torch.zeros(2, 2, dtype=torch.bool)
    for name, preset in LOSS_PRESETS.items():
        out = policy_loss(logp, old, torch.ones(2), mask, ref_logp=old, **preset)
        assert out.loss.item() == 0.0, name
        (grad,) = torch.autograd.grad(out.loss, logp)
        assert torch.isfinite(grad).all() and (grad == 0).all(), name


def test_masked_out_garbage_is_ignored():
    logp, old = _inputs([[0.1, 0.0]])
    with torch.no_grad():
        logp[0, 1] = float("-inf")
    mask = torch.tensor([[1, 0]]).bool()
    old = old.clone()
    old[0, 1] = float("nan")
    out = policy_loss(logp, old, torch.ones(1), mask)
    assert math.isfinite(out.loss.item())
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(old_logp=torch.zeros(2, 3)), "old_logp has shape"),
        (dict(advantages=torch.zeros(3)), "advantages must have shape"),
        (dict(advantages=torch.tensor([1.0, float("nan")])), "advantages has non-finite"),
        (dict(logp=torch.tensor([[float("nan"), 0.0], [0.0, 0.0]])), "logp has non-finite"),
        (dict(ratio_level="word"), "ratio_level"),
        (dict(loss_agg="mean"), "loss_agg"),
        (dict(clip_low=-0.1), "clip_low"),
        (dict(cispo_cap=0.0), "cispo_cap"),
        (dict(kl_coef=-1.0), "kl_coef"),
        (dict(ref_logp=torch.zeros(2, 1), kl_coef=0.1), "ref_logp has shape"),
    ],
)
def test_bad_inputs_name_the_argument(change, message):
    kwargs = dict(logp=torch.zeros(2, 2), old_logp=torch.zeros(2, 2), advantages=torch.ones(2), mask=torch.ones(2, 2))
    kwargs.update(change)
    with pytest.raises(ValueError, match=message):
        policy_loss(**kwargs)


@pytest.mark.parametrize("name", sorted(LOSS_PRESETS))
def test_presets_run_and_improve_the_surrogate(name):
    """One gradient step on each preset's loss raises the logp of positive-advantage tokens."""
    torch.manual_seed(1)
    logits = torch.randn(4, 6, requires_grad=True)
    logp = torch.log_softmax(logits, -1)
    old = logp.detach()
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    mask = torch.ones(4, 6, dtype=torch.bool)
    out = policy_loss(logp, old, adv, mask, ref_logp=old, entropy=torch.ones(4, 6), **LOSS_PRESETS[name])
    assert out.metrics["entropy"] == pytest.approx(1.0)
    out.loss.backward()
    with torch.no_grad():
        new_logp = torch.log_softmax(logits - 0.1 * logits.grad, -1)
    delta = (new_logp - old).mean(-1)
    assert float(delta[0]) > 0 > float(delta[1]), name


def test_policy_loss_micro_batch_invariance():
    torch.manual_seed(2)
    logp = (torch.randn(6, 5) * 0.1 - 1).requires_grad_(True)
    old = logp.detach() + torch.randn(6, 5) * 0.05
    adv = torch.randn(6)
    mask = torch.rand(6, 5) < 0.7
    for name, preset in LOSS_PRESETS.items():
        full = policy_loss(logp, old, adv, mask, ref_logp=old, **preset).loss
        (full_grad,) = torch.autograd.grad(full, logp)
        num_tokens = float(mask.sum())
        num_rows = float((mask.sum(-1) > 0).sum()) if preset["loss_agg"] == "seq_mean_token_mean" else 6.0
        total = 0
        for rows in (slice(0, 2), slice(2, 6)):
            total = (
                total
                + policy_loss(
                    logp[rows],
                    old[rows],
                    adv[rows],
                    mask[rows],
                    ref_logp=old[rows],
                    num_tokens=num_tokens,
                    num_rows=num_rows,
                    norm_length=5,
                    **preset,
                ).loss
            )
        (split_grad,) = torch.autograd.grad(total, logp)
        torch.testing.assert_close(total, full, msg=name)
        torch.testing.assert_close(split_grad, full_grad, msg=name)


@pytest.mark.parametrize("name", sorted(LOSS_PRESETS))
def test_loss_spec_computes_policy_loss_with_its_options(name):
    torch.manual_seed(0)
    logp, old, ref = (torch.randn(3, 4) - 1.0 for _ in range(3))
    advantages, mask = torch.tensor([1.0, -0.5, 2.0]), torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    options = {**LOSS_PRESETS[name], "kl_coef": 0.1, "norm_length": 5.0}
    spec = LossSpec(**options)
    assert spec.kl_on and not LossSpec().kl_on
    expected = policy_loss(logp, old, advantages, mask, ref_logp=ref, num_rows=3.0, **options)
    out = spec(logp, old, advantages, mask, ref_logp=ref, num_rows=3.0)
    assert torch.equal(out.loss, expected.loss) and out.metrics == expected.metrics
    with pytest.raises(TypeError):
        LossSpec(clip=0.1)  # an unknown option is refused, not carried along


def test_combined_loss_metrics_by_hand():
    parts = [
        {"loss": 1.0, "ratio_max": 1.5, "ratio_min": 0.9, "log_ratio_abs_max": 0.4, "entropy": 2.0},
        {"loss": 3.0, "ratio_max": 1.1, "ratio_min": 0.7, "log_ratio_abs_max": 0.1},
    ]
    plain = combine_loss_metrics(parts)
    assert plain == {"loss": 2.0, "ratio_max": 1.5, "ratio_min": 0.7, "log_ratio_abs_max": 0.4, "entropy": 2.0}
    weighted = combine_loss_metrics(parts, weights=[1.0, 3.0])
    assert weighted["loss"] == pytest.approx((1.0 + 9.0) / 4.0)  # the token-weighted mean
    assert weighted["ratio_max"] == 1.5 and weighted["ratio_min"] == 0.7  # extremes ignore the weights
    assert weighted["entropy"] == 2.0  # over the parts that report it
    assert combine_loss_metrics([]) == {}
    with pytest.raises(ValueError, match="2 parts but 1 weights"):
        combine_loss_metrics(parts, weights=[1.0])
