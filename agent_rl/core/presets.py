"""The named algorithms and losses, and the other vocabularies a config chooses from, as data: what
``algo=NAME`` and ``algo.loss=NAME`` select, and the kinds of anchor key.

Plain dicts, no torch: ``agent_rl.config`` validates and resolves against them cheaply, and
``agent_rl.core.losses.policy_loss(**LOSS_PRESETS[name])`` runs one.
"""

from __future__ import annotations

from typing import Any

ALGORITHM_PRESETS: dict[str, dict[str, Any]] = {
    # name: episode-level advantage, loss preset (LOSS_PRESETS), step-level credit (none, anchor for
    # GiGPO, graph), and the step level's normalization when step credit is turned on.
    "grpo": {"advantage": "grpo", "loss": "grpo", "step_credit": "none", "step_normalize": "mean_std"},
    "drgrpo": {"advantage": "drgrpo", "loss": "drgrpo", "step_credit": "none", "step_normalize": "mean"},
    "dapo": {"advantage": "grpo", "loss": "dapo", "step_credit": "none", "step_normalize": "mean_std"},
    "gspo": {"advantage": "grpo", "loss": "gspo", "step_credit": "none", "step_normalize": "mean_std"},
    "rloo": {"advantage": "rloo", "loss": "rloo", "step_credit": "none", "step_normalize": "mean"},
    "cispo": {"advantage": "grpo", "loss": "cispo", "step_credit": "none", "step_normalize": "mean_std"},
    # GiGPO credit with Dr.GRPO's mean-centred advantages at both levels (no std: a group whose
    # returns barely differ keeps small advantages) and GSPO-token's sequence-level ratio. The
    # invalid-action penalty belongs in algo.invalid_penalty, outside the group statistics.
    "gigpo": {"advantage": "drgrpo", "loss": "gspo_token", "step_credit": "anchor", "step_normalize": "mean"},
}
"""Algorithm presets. Each sets the episode-level advantage, the loss preset, which step-level
credit is added and how it is normalized. ``algo.advantage``, ``algo.loss``, ``algo.step_credit``
and ``algo.step_normalize`` override one part, so ``algo=dapo algo.step_credit=anchor`` is DAPO's
loss with GiGPO credit, ``algo=gigpo algo.step_credit=graph`` is graph credit in GiGPO's place and
``algo=gigpo algo.loss=grpo`` is GiGPO credit with GRPO's token-level ratio."""

LOSS_PRESETS: dict[str, dict[str, Any]] = {
    # DeepSeekMath GRPO: token ratio, symmetric clip, per-sequence token mean, k3 KL to the reference.
    "grpo": dict(
        ratio_level="token",
        clip_low=0.2,
        clip_high=0.2,
        loss_agg="seq_mean_token_mean",
        kl_coef=0.001,
        kl_estimator="k3",
    ),
    # Dr.GRPO: no length normalization bias: token sum over a constant (B * norm_length); no KL.
    "drgrpo": dict(ratio_level="token", clip_low=0.2, clip_high=0.2, loss_agg="seq_mean_token_sum_norm", kl_coef=0.0),
    # DAPO: clip-higher, token-level mean over the batch, no KL (dynamic sampling and overlong
    # shaping live in the rollout config).
    "dapo": dict(ratio_level="token", clip_low=0.2, clip_high=0.28, loss_agg="token_mean", kl_coef=0.0),
    # GSPO: sequence-level ratio (length-normalized), clipped with a much narrower band.
    "gspo": dict(ratio_level="sequence", clip_low=3e-4, clip_high=4e-4, loss_agg="seq_mean_token_mean", kl_coef=0.0),
    # GSPO-token: the GSPO ratio value with per-token gradients (for per-token advantages).
    "gspo_token": dict(
        ratio_level="sequence_token", clip_low=3e-4, clip_high=4e-4, loss_agg="seq_mean_token_mean", kl_coef=0.0
    ),
    # RLOO: REINFORCE with the leave-one-out baseline (the advantage mode); no clipping.
    "rloo": dict(ratio_level="token", clip_low=None, clip_high=None, loss_agg="seq_mean_token_mean", kl_coef=0.0),
    # CISPO: clipped, stop-gradient importance weight times A * logp; every token keeps a gradient.
    "cispo": dict(
        ratio_level="token", clip_low=None, clip_high=None, cispo_cap=4.0, loss_agg="token_mean", kl_coef=0.0
    ),
}
"""Keyword arguments of ``agent_rl.core.losses.policy_loss`` for each named loss."""

RATIO_LEVELS = ("token", "sequence", "sequence_token")
"""Where the importance ratio is taken (``agent_rl.core.losses.log_importance_weights``)."""
LOSS_AGGS = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")
"""How token losses are averaged into the batch loss (``agent_rl.core.losses.aggregate``)."""
KL_ESTIMATORS = ("k1", "k2", "k3")
"""Estimators of the KL to the reference (``agent_rl.core.losses.kl_penalty``)."""
K3_CLAMP = 10.0
"""The default bound on each token's k3 (``algo.kl_clamp``): verl's ``low_var_kl``."""

LOSS_KWARGS = ("ratio_level", "clip_low", "clip_high", "cispo_cap", "loss_agg", "norm_length")
"""Keys ``algo.loss_kwargs`` may override on top of the loss preset (``agent_rl.core.losses.policy_loss``)."""

KEY_KINDS = ("state", "observation", "fingerprint", "similarity", "context")
"""The kinds of anchor key (``env.anchor_key``; ``agent_rl.anchors.compute_anchor_keys`` computes each); an
environment names its default kind when it is registered."""

EPISODE_MODES = ("grpo", "drgrpo", "rloo")
"""Episode-level advantage estimators (``agent_rl.core.advantages.episode_advantages``)."""
EPISODE_STATS = ("trajectory", "step")
"""What the episode-level statistics are taken over: one return per trajectory or per step."""
INVALID_CREDIT = ("outcome", "penalty")
"""What an invalid step is credited with: its trajectory's credit less the penalty, or the penalty alone."""
STEP_NORMALIZE = ("mean", "mean_std")
"""How step-level advantages are normalized within their group."""
STEP_CREDIT = ("none", "anchor", "graph")
"""Step-level credit: none, ``anchor`` (GiGPO: each step's return-to-go against the other steps
taken from the same anchor state, ``agent_rl.core.advantages.step_advantages``) or ``graph`` (each
step's progress towards a goal in the group's state graph, ``agent_rl.core.advantages.graph_advantages``)."""
