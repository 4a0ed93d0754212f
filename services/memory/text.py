"""Text normalisation, tokens and BM25-style sparse vectors.

Qdrant multiplies the query side by IDF (`Modifier.IDF`, computed at query time over the
namespace), so a document's sparse value is BM25's saturated term frequency
`tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avg_len))` and the query's is 1 per term;
their dot product is the BM25 score. `avg_len` is a fixed estimate because a document is
encoded before the corpus it joins is known (fastembed's Bm25 does the same); 20 words
measured better than 12 on LoCoMo, where a memory with its neighbours' words runs about that long.

Stemming uses `snowballstemmer` (pure Python, the Snowball project's own port): it merges
"hiking"/"hikes"/"hiked", which matters when a question and the memory phrase one event
differently. fastembed's Bm25 would need a model download at run time, which we cannot assume.
"""

from __future__ import annotations

import re
import unicodedata
import zlib
from collections import Counter
from functools import lru_cache
from typing import Sequence

import snowballstemmer

_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?", re.UNICODE)

STOP_WORDS = frozenset(
    ["a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are", "aren't", "as", "at", "be", "because", "been", "before", "being", "below", "between", "both", "but", "by", "can", "can't", "cannot", "could", "couldn't", "did", "didn't", "do", "does", "doesn't", "doing", "don't", "down", "during", "each", "few", "for", "from", "further", "had", "hadn't", "has", "hasn't", "have", "haven't", "having", "he", "he'd", "he'll", "he's", "her", "here", "here's", "hers", "herself", "him", "himself", "his", "how", "how's", "i", "i'd", "i'll", "i'm", "i've", "if", "in", "into", "is", "isn't", "it", "it's", "its", "itself", "let's", "me", "more", "most", "mustn't", "my", "myself", "no", "nor", "not", "of", "off", "on", "once", "only", "or", "other", "ought", "our", "ours", "ourselves", "out", "over", "own", "same", "shan't", "she", "she'd", "she'll", "she's", "should", "shouldn't", "so", "some", "such", "than", "that", "that's", "the", "their", "theirs", "them", "themselves", "then", "there", "there's", "these", "they", "they'd", "they'll", "they're", "they've", "this", "those", "through", "to", "too", "under", "until", "up", "very", "was", "wasn't", "we", "we'd", "we'll", "we're", "we've", "were", "weren't", "what", "what's", "when", "when's", "where", "where's", "which", "while", "who", "who's", "whom", "why", "why's", "with", "won't", "would", "wouldn't", "you", "you'd", "you'll", "you're", "you've", "your", "yours", "yourself", "yourselves", "also", "just", "s", "t", "will", "shall", "may", "might", "must", "did", "does"]
)


def normalize_text(text: str) -> str:
    """Unicode-compatible, case-folded, whitespace-collapsed: the form content ids derive from."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


class Tokenizer:
    def __init__(self, stem: bool = True, stop_words: frozenset[str] = STOP_WORDS):
        self._stop = stop_words
        self._stemmer = snowballstemmer.stemmer("english") if stem else None
        self._stem = lru_cache(maxsize=65536)(self._stem_uncached)

    def _stem_uncached(self, word: str) -> str:
        return self._stemmer.stemWord(word) if self._stemmer else word

    def words(self, text: str) -> list[str]:
        """Lower-cased words with apostrophes folded ("Caroline's" -> "caroline")."""
        out = []
        for match in _WORD.finditer(unicodedata.normalize("NFKC", text).casefold()):
            word = match.group(0)
            if word.endswith("'s"):
                word = word[:-2]
            out.append(word)
        return out

    def terms(self, text: str) -> list[str]:
        """Stemmed words without stop words: what BM25 counts."""
        return [self._stem(w) for w in self.words(text) if w not in self._stop]


def term_index(term: str) -> int:
    # A stable 32-bit hash: the vocabulary is open, and collisions between two real words in
    # one namespace are rare enough not to matter for ranking.
    return zlib.crc32(term.encode("utf-8"))


class SparseEncoder:
    def __init__(self, tokenizer: Tokenizer, k1: float = 1.2, b: float = 0.75, avg_len: float = 20.0):
        self.tokenizer = tokenizer
        self.k1, self.b, self.avg_len = k1, b, avg_len

    def document(self, text: str, context: Sequence[tuple[str, float]] = ()) -> tuple[list[int], list[float]]:
        """BM25 weights of `text`; `context` adds neighbouring text whose words count `weight` each."""
        return self.document_terms(self.tokenizer.terms(text),
                                   [(self.tokenizer.terms(extra), weight) for extra, weight in context])

    def document_terms(self, terms: Sequence[str],
                       context: Sequence[tuple[Sequence[str], float]] = ()) -> tuple[list[int], list[float]]:
        """`document` of text already tokenized (`Tokenizer.terms`): a caller that encodes each
        message with its neighbours as context tokenizes each message once, not once per neighbour."""
        counts: dict[str, float] = dict(Counter(terms))
        for extra_terms, weight in context:
            for term in extra_terms:
                counts[term] = counts.get(term, 0.0) + weight
        length = sum(counts.values())
        if not length:
            return [], []
        norm = self.k1 * (1 - self.b + self.b * length / self.avg_len)
        weights: dict[int, float] = {}
        for term, tf in counts.items():
            idx = term_index(term)
            weights[idx] = weights.get(idx, 0.0) + tf * (self.k1 + 1) / (tf + norm)
        indices = sorted(weights)
        return indices, [weights[i] for i in indices]

    def query(self, text: str) -> tuple[list[int], list[float]]:
        indices = sorted({term_index(t) for t in self.tokenizer.terms(text)})
        return indices, [1.0] * len(indices)
