"""Near-duplicate texts found with MinHash locality-sensitive hashing (the datasketch package).

A text's shingles are its runs of ``SHINGLE_WORDS`` consecutive lower-cased words (a
shorter text is one shingle); two texts are near duplicates when the Jaccard similarity
of their shingle sets, estimated from MinHash signatures, reaches the threshold. The
LSH index proposes candidates in constant time per text; a candidate counts only when
its estimated similarity really reaches the threshold. Exact copies always match.
"""

from __future__ import annotations

from collections.abc import Sequence

from ringtrain.data.errors import DatasetError
from ringtrain.data.synth_filters import words

SHINGLE_WORDS = 3
NUM_PERM = 128
INSTALL = "pip install 'ringtrain[synthesize]' (or: pip install datasketch)"


def shingles(text: str, size: int = SHINGLE_WORDS) -> set[bytes]:
    """The word shingles of ``text`` (a text of fewer words is one shingle)."""
    text_words = words(text)
    if len(text_words) <= size:
        return {" ".join(text_words).encode()}
    return {" ".join(text_words[i : i + size]).encode() for i in range(len(text_words) - size + 1)}


class NearDuplicateIndex:
    """The texts kept so far; ``keep`` admits a batch of texts that are near none of them."""

    def __init__(self, threshold: float = 0.7, num_perm: int = NUM_PERM, seed: int = 1) -> None:
        if not 0 < threshold <= 1:
            raise DatasetError(f"the near-duplicate threshold must be in (0, 1], not {threshold}")
        try:
            from datasketch import LeanMinHash, MinHash, MinHashLSH
        except ImportError:
            raise DatasetError(f"near-duplicate removal needs datasketch: {INSTALL}") from None
        self._minhash, self._lean = MinHash, LeanMinHash
        try:
            self._lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
        except ValueError:  # near 1 the best banding is one band, which datasketch refuses
            self._lsh = MinHashLSH(
                threshold=threshold, num_perm=num_perm, params=(2, num_perm // 2)
            )
        self._signatures: dict[int, object] = {}
        self.threshold = threshold
        self.num_perm = num_perm
        self.seed = seed

    def __len__(self) -> int:
        return len(self._signatures)

    def keep(self, texts: Sequence[str]) -> list[bool]:
        """For each text in order: True when it is near no text kept before it (it is then
        kept), False for a near duplicate."""
        signatures = self._minhash.bulk(
            [shingles(text) for text in texts], num_perm=self.num_perm, seed=self.seed
        )
        kept = []
        for signature in signatures:
            near = any(
                self._signatures[key].jaccard(signature) >= self.threshold
                for key in self._lsh.query(signature)
            )
            if not near:
                key = len(self._signatures)
                lean = self._lean(signature)  # the hash values only, not the permutations
                self._lsh.insert(key, lean, check_duplication=False)
                self._signatures[key] = lean
            kept.append(not near)
        return kept
