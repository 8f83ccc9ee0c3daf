"""BLEU-1..4, ROUGE-L and CIDEr-D computed exactly as pycocoevalcap 1.2's `Bleu(4)`, `Rouge()` and `Cider()` scorers
compute them, on token lists, with no Java (reimplemented from the published algorithm; tests compare against the
package to 1e-9 when it is installed).

Inputs are `references = {id: [[token, ...], ...]}` and `hypotheses = {id: [token, ...]}` (one hypothesis per id,
at least one reference). pycocoevalcap splits each string on spaces; passing it `" ".join(tokens)` gives the same
numbers as these functions (tokens never contain whitespace). Tokenisation is `eval.task_metrics.tokenize`.

- BLEU (corpus level): clipped n-gram counts summed over the corpus, geometric mean of p1..pn with pycocoevalcap's
  smoothing `(correct + 1e-15) / (guess + 1e-9)`, the reference length of each sentence the closest one (ties go to
  the shorter), brevity penalty `exp(1 - r / c)` when c < r.
- ROUGE-L: per id, the best LCS precision and the best LCS recall over its references (each maximised separately),
  F with beta = 1.2; the mean over ids. An empty hypothesis scores 0.
- CIDEr-D: TF-IDF over 1-4-grams with idf = log(N) - log(max(1, df)) computed over the whole evaluated corpus (score
  the test set in ONE call, never per batch), clipped cosine `min(vh, vr) * vr`, Gaussian length penalty with
  sigma = 6 on the difference of the bigram counts (pycocoevalcap's length), mean over n, / number of references,
  x 10, then the mean over ids.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

import numpy as np

Tokens = Sequence[str]
N = 4
TINY, SMALL = 1e-15, 1e-9
ROUGE_BETA = 1.2
CIDER_SIGMA = 6.0


def _ngrams(tokens: Tokens, n: int = N) -> Counter:
    counts: Counter = Counter()
    for k in range(1, n + 1):
        for i in range(len(tokens) - k + 1):
            counts[tuple(tokens[i : i + k])] += 1
    return counts


def _check(references: Mapping[str, Sequence[Tokens]], hypotheses: Mapping[str, Tokens]) -> list[str]:
    ids = list(references)
    if set(ids) != set(hypotheses):
        raise ValueError("references and hypotheses must have the same ids")
    for i in ids:
        if not references[i]:
            raise ValueError(f"id {i!r} has no reference caption")
    return ids


def bleu(references: Mapping[str, Sequence[Tokens]], hypotheses: Mapping[str, Tokens], n: int = N) -> list[float]:
    """Corpus BLEU-1..n as pycocoevalcap's `Bleu(n).compute_score` returns it (option 'closest')."""
    test_len = ref_len = 0
    guess, correct = [0] * n, [0] * n
    for i in _check(references, hypotheses):
        hyp = list(hypotheses[i])
        max_ref: dict[tuple, int] = {}
        for ref in references[i]:
            for gram, count in _ngrams(ref, n).items():
                max_ref[gram] = max(max_ref.get(gram, 0), count)
        lengths = [len(r) for r in references[i]]
        ref_len += min((abs(length - len(hyp)), length) for length in lengths)[1]
        test_len += len(hyp)
        for k in range(n):
            guess[k] += max(0, len(hyp) - k)
        for gram, count in _ngrams(hyp, n).items():
            correct[len(gram) - 1] += min(max_ref.get(gram, 0), count)
    scores, product = [], 1.0
    for k in range(n):
        product *= float(correct[k] + TINY) / (guess[k] + SMALL)
        scores.append(product ** (1.0 / (k + 1)))
    ratio = (test_len + TINY) / (ref_len + SMALL)
    if ratio < 1:
        scores = [s * math.exp(1 - 1 / ratio) for s in scores]
    return scores


def _lcs(a: Tokens, b: Tokens) -> int:
    if len(a) < len(b):
        a, b = b, a
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def rouge_l_scores(references: Mapping[str, Sequence[Tokens]], hypotheses: Mapping[str, Tokens]) -> list[float]:
    """ROUGE-L F (beta 1.2) per id, in id order, as pycocoevalcap's `Rouge.calc_score`."""
    scores = []
    for i in _check(references, hypotheses):
        hyp = hypotheses[i]
        if not hyp:
            scores.append(0.0)
            continue
        precision = max(_lcs(ref, hyp) / len(hyp) for ref in references[i])
        recall = max((_lcs(ref, hyp) / len(ref) if ref else 0.0) for ref in references[i])
        if precision and recall:
            scores.append((1 + ROUGE_BETA**2) * precision * recall / (recall + ROUGE_BETA**2 * precision))
        else:
            scores.append(0.0)
    return scores


def rouge_l(references: Mapping[str, Sequence[Tokens]], hypotheses: Mapping[str, Tokens]) -> float:
    return float(np.mean(np.array(rouge_l_scores(references, hypotheses))))


def cider_d_scores(references: Mapping[str, Sequence[Tokens]], hypotheses: Mapping[str, Tokens]) -> list[float]:
    """CIDEr-D per id, in id order, as pycocoevalcap's `CiderScorer.compute_cider` (idf over this corpus)."""
    ids = _check(references, hypotheses)
    ref_counts = [[_ngrams(r) for r in references[i]] for i in ids]
    document_frequency: Counter = Counter()
    for refs in ref_counts:
        document_frequency.update({gram for counts in refs for gram in counts})
    log_n = np.log(float(len(ids)))

    def vectorise(counts: Counter) -> tuple[list[dict], list[float], int]:
        vec: list[dict] = [defaultdict(float) for _ in range(N)]
        norm = [0.0] * N
        length = 0
        for gram, term_freq in counts.items():
            n = len(gram) - 1
            vec[n][gram] = float(term_freq) * (log_n - np.log(max(1.0, document_frequency[gram])))
            norm[n] += pow(vec[n][gram], 2)
            if n == 1:  # pycocoevalcap's "length" counts bigrams
                length += term_freq
        return vec, [np.sqrt(x) for x in norm], length

    scores = []
    for i, refs in zip(ids, ref_counts, strict=True):
        vec, norm, length = vectorise(_ngrams(hypotheses[i]))
        total = np.array([0.0] * N)
        for counts in refs:
            vec_ref, norm_ref, length_ref = vectorise(counts)
            delta = float(length - length_ref)
            value = np.array([0.0] * N)
            for n in range(N):
                for gram in vec[n]:
                    value[n] += min(vec[n][gram], vec_ref[n][gram]) * vec_ref[n][gram]
                if norm[n] != 0 and norm_ref[n] != 0:
                    value[n] /= norm[n] * norm_ref[n]
                value[n] *= np.e ** (-(delta**2) / (2 * CIDER_SIGMA**2))
            total += value
        scores.append(float(np.mean(total)) / len(refs) * 10.0)
    return scores


def cider_d(references: Mapping[str, Sequence[Tokens]], hypotheses: Mapping[str, Tokens]) -> float:
    return float(np.mean(np.array(cider_d_scores(references, hypotheses))))


def caption_metrics(references: Mapping[str, Sequence[Tokens]], hypotheses: Mapping[str, Tokens]) -> dict[str, float]:
    """The six numbers of the paper's captioning table, as fractions: BLEU-1..4, ROUGE-L, CIDEr (CIDEr-D)."""
    if not references:
        raise ValueError("no captions to score")
    scores = bleu(references, hypotheses)
    return {
        **{f"BLEU-{k + 1}": float(s) for k, s in enumerate(scores)},
        "ROUGE-L": rouge_l(references, hypotheses),
        "CIDEr": cider_d(references, hypotheses),
    }
