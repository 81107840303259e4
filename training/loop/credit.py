"""The iteration's credit step: anchor keys for a rollout batch, then its advantages."""

from __future__ import annotations

from agent_rl.anchors import batch_anchor_keys
from agent_rl.config import Config
from agent_rl.core.advantages import Credit, compute_advantages
from agent_rl.core.batch import StepBatch


def assign_credit(batch: StepBatch, cfg: Config) -> Credit:
    """Key every step of ``batch`` by ``env.anchor_key`` (stored as ``batch.anchor_key``), then
    compute the advantages ``algo`` names over the groups and anchor states."""
    batch.anchor_key = batch_anchor_keys(
        batch,
        cfg.env.anchor_key,
        history_turns=cfg.rollout.history_turns,
        history_observations=cfg.rollout.history_observations,
    )
    return compute_advantages(batch, cfg.algo)
