"""Stable 64-bit keys for strings.

Keys must be equal across processes and machines (Python's ``hash()`` is salted per process), so
they come from blake2b with an 8-byte digest. A ``domain`` goes into blake2b's personalization
field: keys of different kinds (observation text, error fingerprint, env state) never collide by
construction even when the underlying strings are equal.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

MAX_DOMAIN_BYTES = 16  # blake2b's personalization field holds at most 16 bytes


def _person(domain: str) -> bytes:
    person = domain.encode()
    if len(person) > MAX_DOMAIN_BYTES:
        raise ValueError(f"hash domain {domain!r} is longer than {MAX_DOMAIN_BYTES} bytes")
    return person


def stable_hash64(text: str, *, domain: str = "") -> int:
    """The 64-bit blake2b key of ``text`` (UTF-8) in ``domain``, as an int in ``[0, 2**64)``."""
    if not isinstance(text, str):
        raise TypeError(f"stable_hash64 needs a str, got {type(text).__name__}")
    digest = hashlib.blake2b(text.encode(), digest_size=8, person=_person(domain)).digest()
    return int.from_bytes(digest, "little")


def unique_inverse(texts: Iterable[str]) -> tuple[list[str], np.ndarray]:
    """Distinct strings in first-appearance order and, per input row, the index of its string.

    A dict is several times faster than ``np.unique`` on string arrays, and real batches repeat
    strings heavily, so everything downstream works on the distinct strings only.
    """
    index: dict[str, int] = {}
    inverse = np.fromiter((index.setdefault(text, len(index)) for text in texts), dtype=np.int64)
    return list(index), inverse


def hash_strings(texts: Iterable[str], *, domain: str = "") -> np.ndarray:
    """``stable_hash64`` of every string, as ``uint64``; each distinct string is hashed once."""
    uniques, inverse = unique_inverse(texts)
    person = _person(domain)
    try:
        digests = b"".join(hashlib.blake2b(text.encode(), digest_size=8, person=person).digest() for text in uniques)
    except AttributeError:
        bad = next(text for text in uniques if not isinstance(text, str))
        raise TypeError(f"hash_strings needs str values, got {type(bad).__name__}: {bad!r}") from None
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)[inverse]


def normalize_whitespace(text: str) -> str:
    """Collapse every run of whitespace to one space and strip the ends."""
    return " ".join(text.split())


def mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer, in place: a bijection on uint64 whose output bits all depend on all input bits."""
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z
