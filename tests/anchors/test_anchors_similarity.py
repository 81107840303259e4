"""Near-duplicate clustering with MinHash/LSH."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_rl.anchors import cluster_similar, minhash_signatures
from agent_rl.anchors.similarity import lsh_bands

ROOMS = [
    "You are in a damp cellar. Barrels line the north wall and a ladder leads up.",
    "A sunny kitchen with a long oak table. A knife lies on the counter.",
    "The throne room is empty. Faded banners hang above a cracked marble floor.",
    "Dense forest surrounds you. Somewhere to the east a river is rushing.",
    "program:1:7: error: unknown word 'dupp'",
]


def noisy_variant(room: str, turn: int, health: int) -> str:
    return f"Turn {turn}. Health {health}/20. {room}"


def shingles(text: str, k: int = 4) -> set[bytes]:
    data = text.encode()
    return {data[i : i + k] for i in range(max(len(data) - k + 1, 1))}


def test_near_duplicates_together_distinct_apart():
    texts = [noisy_variant(room, turn, 20 - turn) for turn in (3, 4, 15) for room in ROOMS]
    ids = cluster_similar(texts, threshold=0.8)
    expected = np.tile(np.arange(len(ROOMS)), 3)  # clusters numbered by first appearance
    assert np.array_equal(ids, expected)


def test_ids_are_dense_in_first_appearance_order_and_exact_duplicates_share():
    texts = ["zebra crossing ahead", "apple pie recipe", "zebra crossing ahead", "quantum flux"]
    assert cluster_similar(texts, threshold=1.0).tolist() == [0, 1, 0, 2]
    assert cluster_similar([]).shape == (0,)


def test_deterministic_across_calls_and_seed_dependent_only_in_noise():
    texts = [noisy_variant(room, turn, 7) for room in ROOMS for turn in range(10)]
    first = cluster_similar(texts)
    assert np.array_equal(first, cluster_similar(list(texts)))
    assert np.array_equal(minhash_signatures(texts, seed=3), minhash_signatures(texts, seed=3))
    assert not np.array_equal(minhash_signatures(texts, seed=3), minhash_signatures(texts, seed=4))


def test_groups_never_share_clusters():
    texts = [ROOMS[0], ROOMS[0] + " ", ROOMS[0], ROOMS[1]]
    ids = cluster_similar(texts, groups=["g1", "g1", "g2", "g2"])
    assert ids.tolist() == [0, 0, 1, 2]


def test_minhash_estimates_jaccard():
    rng = np.random.default_rng(0)
    alphabet = np.array(list("abcdefghijklmnopqrstuvwxyz "))
    errors = []
    for _ in range(40):
        base = "".join(rng.choice(alphabet, 300))
        a, b = base[: 200 + rng.integers(0, 100)], base[rng.integers(0, 100) :]
        exact = len(shingles(a) & shingles(b)) / len(shingles(a) | shingles(b))
        signature = minhash_signatures([a, b], num_perm=256, seed=int(rng.integers(1 << 30)))
        errors.append((signature[0] == signature[1]).mean() - exact)
    errors = np.array(errors)
    assert abs(errors.mean()) < 0.02  # unbiased: sd of one estimate at 256 perms is <= 0.031
    assert np.abs(errors).max() < 0.13


def test_agrees_with_exact_dice_components():
    """On separated data (pairs far from the threshold) MinHash/LSH finds exactly the components of
    the graph 'exact Dice of 4-gram sets >= threshold'."""
    texts = [noisy_variant(room, turn, health) for room in ROOMS[:4] for turn, health in ((1, 20), (22, 9), (305, 1))]
    sets = [shingles(" ".join(t.split())) for t in texts]
    dice = np.array([[2 * len(a & b) / (len(a) + len(b)) for b in sets] for a in sets])
    assert ((dice > 0.88) | (dice < 0.3)).all()  # the data is separated from the threshold 0.8
    labels = np.arange(len(texts))
    for _ in range(len(texts)):  # exact components by repeated min over neighbours
        labels = np.array([labels[dice[i] >= 0.8].min() for i in range(len(texts))])
    _, expected = np.unique(labels, return_inverse=True)
    ids = cluster_similar(texts, threshold=0.8)
    assert np.array_equal(ids, expected)


def test_lsh_bands_hand_computed():
    # J = 2/3 (Dice 0.8): r=4, b=16 gives P = 1-(1-(2/3)^4)^16 = 0.970; r=5, b=12 only 0.816.
    assert lsh_bands(2 / 3, 64) == (16, 4)
    assert lsh_bands(1.0, 64) == (1, 64)


def test_bad_arguments():
    with pytest.raises(ValueError, match="threshold must be in"):
        cluster_similar(["a"], threshold=0.0)
    with pytest.raises(ValueError, match="groups has 1 rows but texts has 2"):
        cluster_similar(["a", "b"], groups=[0])
    with pytest.raises(TypeError, match="needs str texts"):
        cluster_similar(["a", None])
    with pytest.raises(ValueError, match="num_perm and shingle"):
        minhash_signatures(["a"], num_perm=0)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(ROOMS + ["x", "", "  x  "]), max_size=12), st.integers(0, 3))
def test_identical_normalized_texts_share_ids_and_ids_are_first_appearance_order(texts, seed):
    ids = cluster_similar(texts, seed=seed)
    seen: dict[str, int] = {}
    for text, cluster in zip(texts, ids):
        seen.setdefault(" ".join(text.split()), int(cluster))
        assert seen[" ".join(text.split())] == cluster
    first_occurrence = [int(c) for i, c in enumerate(ids) if c not in ids[:i]]
    assert first_occurrence == list(range(len(first_occurrence)))
