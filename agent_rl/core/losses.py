"""GRPO-family policy losses, one term per function so each is testable on its own.

Shapes: ``logp``, ``old_logp``, ``ref_logp``, ``mask``, ``entropy`` are (B, T); ``advantages`` is
(B,) or (B, T). ``policy_loss`` composes the terms:

    log_importance_weights -> surrogate (clipped / unclipped / CISPO) -> + kl_coef * KL -> aggregate

Masked-out positions may hold anything (padding garbage, -inf): they are zeroed before use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
import torch

from agent_rl.core.presets import K3_CLAMP, KL_ESTIMATORS, LOSS_AGGS, LOSS_PRESETS, RATIO_LEVELS  # noqa: F401  (LOSS_PRESETS: policy_loss(**LOSS_PRESETS[name]))

RatioLevel = Literal[RATIO_LEVELS]
LossAgg = Literal[LOSS_AGGS]
KLEstimator = Literal[KL_ESTIMATORS]


@dataclass
class PolicyLossOutput:
    loss: torch.Tensor
    """Scalar loss to minimize."""
    token_loss: torch.Tensor
    """(B, T) per-token loss before aggregation, zero where the mask is."""
    metrics: dict[str, float]
    """clip_frac, approx_kl, ratio_mean/min/max, plus kl_ref, entropy, cispo_capped_frac when they apply."""


def _check(name: str, tensor: torch.Tensor, shape: torch.Size, mask: torch.Tensor) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.shape != shape:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}")
    if not bool(torch.isfinite(tensor[mask]).all()):
        raise ValueError(f"{name} has non-finite values where the mask is set")
    return torch.where(mask, tensor, torch.zeros((), dtype=tensor.dtype, device=tensor.device))


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over masked positions; 0 when the mask is empty."""
    weights = mask.to(values.dtype)
    return (values * weights).sum() / weights.sum().clamp(min=1.0)


def log_importance_weights(
    logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, ratio_level: RatioLevel = "token"
) -> torch.Tensor:
    """(B, T) log importance weights.

    - ``token``: logp - old.
    - ``sequence`` (GSPO): the masked mean log-ratio of the row, broadcast to its tokens; the gradient
      flows through the mean.
    - ``sequence_token`` (GSPO-token): logp - sg(logp) + sg(mean log-ratio): value of ``sequence``,
      gradient of each token's own logp.
    """
    weights = mask.to(logp.dtype)
    log_ratio = (logp - old_logp) * weights
    if ratio_level == "token":
        return log_ratio
    seq_log_ratio = log_ratio.sum(-1, keepdim=True) / weights.sum(-1, keepdim=True).clamp(min=1.0)
    if ratio_level == "sequence":
        return seq_log_ratio.expand_as(logp)
    if ratio_level == "sequence_token":
        return logp - logp.detach() + seq_log_ratio.detach()
    raise ValueError(f"ratio_level must be one of {RATIO_LEVELS}, got {ratio_level!r}")


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float | None, clip_high: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO surrogate ``-min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A)`` per token and
    where the clipped branch is active. ``None`` leaves that side unbounded; both ``None`` gives
    the REINFORCE form ``-rho * A``."""
    unclipped = ratio * advantages
    low = None if clip_low is None else 1.0 - clip_low
    high = None if clip_high is None else 1.0 + clip_high
    if low is None and high is None:
        return -unclipped, torch.zeros_like(ratio, dtype=torch.bool)
    clipped = torch.clamp(ratio, min=low, max=high) * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def cispo_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, logp: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO: ``-sg(min(rho, cap)) * A * logp``: the importance weight is capped and detached, so
    every token keeps its policy-gradient signal. Returns the loss and where the cap was hit."""
    weight = torch.clamp(ratio, max=cap).detach()
    return -weight * advantages * logp, ratio > cap


K3_LOG_RATIO_BOUND = 20.0
"""With a k3 clamp, ``d`` is first clamped to +-20 (verl's ``low_var_kl``), so exp(-d) stays finite."""


def kl_penalty(
    logp: torch.Tensor, ref_logp: torch.Tensor, estimator: KLEstimator = "k3", clamp: float | None = None
) -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from samples of pi, with d = logp - ref:
    k1 = d, k2 = d^2 / 2, k3 = exp(-d) + d - 1 (unbiased and non-negative).

    ``clamp`` bounds k3 as verl's ``low_var_kl`` does: d clamped to +-``K3_LOG_RATIO_BOUND``, then
    k3 to at most ``clamp``, so a token beyond the bound adds ``clamp`` and no gradient. Its gradient
    is (1 - ref/pi) d logp: without the bound a token the policy has pushed far below the reference
    (on samples of an older policy) outweighs every other term. k1 and k2 are never clamped."""
    d = logp - ref_logp
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        if clamp is not None:
            d = d.clamp(-K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND)
        k3 = torch.expm1(-d) + d
        return k3 if clamp is None else k3.clamp(max=clamp)
    raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


def aggregate(
    token_loss: torch.Tensor,
    mask: torch.Tensor,
    loss_agg: LossAgg = "seq_mean_token_mean",
    *,
    norm_length: float | None = None,
    num_tokens: float | None = None,
    num_rows: float | None = None,
) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar.

    - ``seq_mean_token_mean``: mean over rows that have tokens of each row's token mean (GRPO);
    - ``token_mean``: sum(l * m) / sum(m) (DAPO);
    - ``seq_mean_token_sum_norm``: sum(l * m) / (B * norm_length), norm_length defaults to T (Dr.GRPO).

    When this call sees one micro-batch of a larger minibatch, pass the minibatch's ``num_tokens``
    (masked tokens) and ``num_rows`` (rows with tokens for ``seq_mean_token_mean``, all rows for
    ``seq_mean_token_sum_norm``) so that summing micro-batch losses equals the full-batch loss.
    """
    weights = mask.to(token_loss.dtype)
    masked = token_loss * weights
    if loss_agg == "token_mean":
        denominator = weights.sum() if num_tokens is None else torch.as_tensor(float(num_tokens))
        return masked.sum() / denominator.clamp(min=1.0)
    if loss_agg == "seq_mean_token_mean":
        row_tokens = weights.sum(-1)
        row_means = masked.sum(-1) / row_tokens.clamp(min=1.0)
        rows = (row_tokens > 0).sum().to(token_loss.dtype) if num_rows is None else torch.as_tensor(float(num_rows))
        return row_means.sum() / rows.clamp(min=1.0)
    if loss_agg == "seq_mean_token_sum_norm":
        length = float(token_loss.shape[-1] if norm_length is None else norm_length)
        if length <= 0:
            raise ValueError(f"norm_length must be positive, got {norm_length}")
        rows = float(token_loss.shape[0] if num_rows is None else num_rows)
        return masked.sum() / max(rows * length, 1.0)
    raise ValueError(f"loss_agg must be one of {LOSS_AGGS}, got {loss_agg!r}")


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ratio_level: RatioLevel = "token",
    clip_low: float | None = 0.2,
    clip_high: float | None = 0.2,
    cispo_cap: float | None = None,
    loss_agg: LossAgg = "seq_mean_token_mean",
    norm_length: float | None = None,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    kl_clamp: float | None = K3_CLAMP,
    entropy: torch.Tensor | None = None,
    num_tokens: float | None = None,
    num_rows: float | None = None,
) -> PolicyLossOutput:
    """The GRPO-family policy loss. See ``LOSS_PRESETS`` for the named algorithms."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise ValueError(f"mask must be a (B, T) tensor, got {getattr(mask, 'shape', type(mask).__name__)}")
    mask = mask.bool()
    shape = mask.shape
    if ratio_level not in RATIO_LEVELS:
        raise ValueError(f"ratio_level must be one of {RATIO_LEVELS}, got {ratio_level!r}")
    if loss_agg not in LOSS_AGGS:
        raise ValueError(f"loss_agg must be one of {LOSS_AGGS}, got {loss_agg!r}")
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {kl_estimator!r}")
    for name, value in (("clip_low", clip_low), ("clip_high", clip_high)):
        if value is not None and not 0.0 <= value:
            raise ValueError(f"{name} must be >= 0 or None, got {value}")
    if cispo_cap is not None and not cispo_cap > 0:
        raise ValueError(f"cispo_cap must be > 0 or None, got {cispo_cap}")
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    if kl_clamp is not None and not kl_clamp > 0:
        raise ValueError(f"kl_clamp must be > 0 or None, got {kl_clamp}")

    logp = _check("logp", logp, shape, mask)
    old_logp = _check("old_logp", old_logp.detach(), shape, mask)
    if not isinstance(advantages, torch.Tensor) or advantages.shape not in (shape[:1], shape):
        raise ValueError(
            f"advantages must have shape {tuple(shape[:1])} or {tuple(shape)}, "
            f"got {tuple(getattr(advantages, 'shape', ()))}"
        )
    if advantages.dim() == 1:
        if not bool(torch.isfinite(advantages).all()):
            raise ValueError("advantages has non-finite values")
        advantages = advantages.unsqueeze(-1).expand(shape)
    advantages = _check("advantages", advantages.detach().to(logp.dtype), shape, mask)

    log_w = log_importance_weights(logp, old_logp, mask, ratio_level)
    ratio = torch.exp(log_w)
    metrics: dict[str, float] = {}
    if cispo_cap is not None:
        token_loss, capped = cispo_surrogate(ratio, advantages, logp, cispo_cap)
        metrics["cispo_capped_frac"] = float(masked_mean(capped.to(logp.dtype), mask))
        clipped = torch.zeros_like(mask)
    else:
        token_loss, clipped = clipped_surrogate(ratio, advantages, clip_low, clip_high)

    if kl_coef > 0 and ref_logp is None:
        raise ValueError("kl_coef > 0 needs ref_logp")
    if ref_logp is not None:
        kl = kl_penalty(logp, _check("ref_logp", ref_logp.detach(), shape, mask), kl_estimator, kl_clamp)
        metrics["kl_ref"] = float(masked_mean(kl.detach(), mask))
        if kl_coef > 0:
            token_loss = token_loss + kl_coef * kl
    token_loss = torch.where(mask, token_loss, torch.zeros_like(token_loss))
    loss = aggregate(token_loss, mask, loss_agg, norm_length=norm_length, num_tokens=num_tokens, num_rows=num_rows)

    with torch.no_grad():
        token_log_ratio = (logp - old_logp).detach()
        masked_ratio = ratio.detach()[mask]
        metrics["clip_frac"] = float(masked_mean(clipped.to(logp.dtype), mask))
        metrics["approx_kl"] = float(masked_mean(kl_penalty(old_logp, logp.detach(), "k3"), mask))
        metrics["log_ratio_abs_max"] = float(token_log_ratio[mask].abs().max()) if mask.any() else 0.0
        metrics["ratio_mean"] = float(masked_ratio.mean()) if mask.any() else 1.0
        metrics["ratio_min"] = float(masked_ratio.min()) if mask.any() else 1.0
        metrics["ratio_max"] = float(masked_ratio.max()) if mask.any() else 1.0
        if entropy is not None:
            entropy = _check("entropy", entropy.detach(), shape, mask)
            metrics["entropy"] = float(masked_mean(entropy, mask))
    return PolicyLossOutput(loss=loss, token_loss=token_loss, metrics=metrics)


@dataclass(frozen=True)
class LossSpec:
    """The options of :func:`policy_loss` that stay fixed for a run: a loss preset
    (``LOSS_PRESETS``) under ``algo.loss_kwargs``, and the KL term. Calling it computes the loss of
    one batch of tokens."""

    ratio_level: RatioLevel = "token"
    clip_low: float | None = 0.2
    clip_high: float | None = 0.2
    cispo_cap: float | None = None
    loss_agg: LossAgg = "seq_mean_token_mean"
    norm_length: float | None = None
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    kl_clamp: float | None = K3_CLAMP

    @property
    def kl_on(self) -> bool:
        """Whether the KL term is on: it needs the reference's logprobs and pulls every row."""
        return self.kl_coef > 0

    def __call__(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        ref_logp: torch.Tensor | None = None,
        entropy: torch.Tensor | None = None,
        num_tokens: float | None = None,
        num_rows: float | None = None,
    ) -> PolicyLossOutput:
        return policy_loss(
            logp,
            old_logp,
            advantages,
            mask,
            ref_logp=ref_logp,
            entropy=entropy,
            num_tokens=num_tokens,
            num_rows=num_rows,
            **asdict(self),
        )


EXTREME_METRICS = {"ratio_max": max, "log_ratio_abs_max": max, "ratio_min": min}
""":func:`policy_loss` metrics that combine over micro-batches and optimizer steps as their extreme,
not a mean."""


def combine_loss_metrics(parts: Sequence[dict[str, float]], weights: Sequence[float] | None = None) -> dict[str, float]:
    """The metrics of several :func:`policy_loss` calls (micro-batches, optimizer steps) as one: each
    key over the parts that report it, as its extreme (``EXTREME_METRICS``) or its mean, weighted by
    ``weights`` (their tokens, say) when given."""
    if weights is not None and len(weights) != len(parts):
        raise ValueError(f"{len(parts)} parts but {len(weights)} weights")
    combined: dict[str, float] = {}
    for key in dict.fromkeys(key for part in parts for key in part):
        reported = [(part[key], 1.0 if weights is None else weights[i]) for i, part in enumerate(parts) if key in part]
        values = np.array([value for value, _ in reported])
        if key in EXTREME_METRICS:
            combined[key] = float(EXTREME_METRICS[key](values))
        elif weights is None:
            combined[key] = float(values.mean())
        else:
            total = sum(weight for _, weight in reported)
            combined[key] = float(sum(value * weight for value, weight in reported) / max(total, 1.0))
    return combined
