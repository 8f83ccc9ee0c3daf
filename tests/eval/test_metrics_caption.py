"""Captioning metrics: equal to pycocoevalcap's Bleu(4) / Rouge() / Cider() to 1e-9 (run live when the package is
installed, stored expected values otherwise), plus hand-computed values and the tokenisers."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from geopilot.eval.task_metrics.caption import bleu, caption_metrics, cider_d, rouge_l, rouge_l_scores
from geopilot.eval.task_metrics.tokenize import TOKENIZERS, ptb_tokens

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "captions_pycocoevalcap.json").read_text())


def _coco(references, hypotheses) -> dict:
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    gts = {k: [" ".join(r) for r in v] for k, v in references.items()}
    res = {k: [" ".join(h)] for k, h in hypotheses.items()}
    b, _ = Bleu(4).compute_score(gts, res, verbose=0)
    return {
        **{f"BLEU-{i + 1}": x for i, x in enumerate(b)},
        "ROUGE-L": Rouge().compute_score(gts, res)[0],
        "CIDEr": Cider().compute_score(gts, res)[0],
    }


@pytest.mark.parametrize("tokenizer", ["raw", "ptb"])
def test_fixture_equals_pycocoevalcap(tokenizer):
    tokenize = TOKENIZERS[tokenizer]
    refs = {k: [tokenize(r) for r in v] for k, v in FIXTURE["references"].items()}
    hyps = {k: tokenize(h) for k, h in FIXTURE["hypotheses"].items()}
    ours = caption_metrics(refs, hyps)
    try:
        expected = _coco(refs, hyps)
    except ImportError:
        expected = FIXTURE["expected"][tokenizer]
    assert set(ours) == {"BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr"}
    for key, value in expected.items():
        assert abs(ours[key] - float(value)) < 1e-9, key
    assert FIXTURE["expected"][tokenizer] == pytest.approx(ours, abs=1e-9)  # the stored values are still right


def test_random_corpora_equal_pycocoevalcap():
    pytest.importorskip("pycocoevalcap")
    rng = random.Random(7)
    vocab = "a the ship sar image bright dark harbor two three of in with near port water".split()
    refs = {
        str(i): [[rng.choice(vocab) for _ in range(rng.randint(1, 12))] for _ in range(rng.randint(1, 4))]
        for i in range(40)
    }
    hyps = {str(i): [rng.choice(vocab) for _ in range(rng.randint(0, 12))] for i in range(40)}
    ours, expected = caption_metrics(refs, hyps), _coco(refs, hyps)
    for key in expected:
        assert abs(ours[key] - expected[key]) < 1e-9, key


def test_bleu_hand_computed():
    refs = {"1": [["the", "cat", "is", "on", "the", "mat"]]}
    hyps = {"1": ["the", "the", "the", "mat"]}
    # clipped unigrams: "the" min(3, 2) + "mat" 1 = 3 of 4; bigrams: "the mat" 1 of 3; trigrams 0 of 2;
    # brevity: c = 4 < r = 6
    bp = math.exp(1 - 6 / 4)
    scores = bleu(refs, hyps)
    assert scores[0] == pytest.approx(0.75 * bp, rel=1e-9)
    assert scores[1] == pytest.approx(math.sqrt(0.75 / 3) * bp, rel=1e-9)
    assert scores[2] == pytest.approx((0.75 / 3 * (1e-15 / 2)) ** (1 / 3) * bp, rel=1e-6)  # smoothed: tiny, not 0
    # the closest reference length, ties to the shorter: hypothesis length 4, references 3 and 5 -> r = 3
    two = {"1": [["a", "b", "c"], ["a", "b", "c", "d", "e"]]}
    assert bleu(two, {"1": ["a", "b", "c", "d"]})[0] == pytest.approx(1.0)


def test_rouge_l_hand_computed():
    refs = {"1": [["a", "b", "c", "d"], ["a", "x"]]}
    hyps = {"1": ["a", "b", "x"]}
    # LCS with ref 1 = 2 (a b): P 2/3, R 2/4; with ref 2 = 2 (a x): P 2/3, R 2/2; best P 2/3, best R 1
    p, r, beta = 2 / 3, 1.0, 1.2
    assert rouge_l(refs, hyps) == pytest.approx((1 + beta**2) * p * r / (r + beta**2 * p))
    assert rouge_l_scores({"1": [["a"]]}, {"1": []}) == [0.0]  # an empty caption scores 0


def test_cider_identical_corpus_and_idf_over_the_whole_corpus():
    refs = {"1": [["a", "ship", "in", "the", "sea"]], "2": [["an", "airport", "runway", "and", "planes"]]}
    # identical captions: every n-gram vector equals its reference, cosine 1 -> 10 per image
    assert cider_d(refs, {k: v[0] for k, v in refs.items()}) == pytest.approx(10.0)
    # a one-image corpus gives idf log(1) - log(1) = 0 everywhere: CIDEr is 0 (score the split in ONE call)
    assert cider_d({"1": refs["1"]}, {"1": refs["1"][0]}) == 0.0


def test_bad_caption_inputs():
    with pytest.raises(ValueError, match="same ids"):
        bleu({"1": [["a"]]}, {"2": ["a"]})
    with pytest.raises(ValueError, match="no reference"):
        bleu({"1": []}, {"1": ["a"]})


def test_ptb_rules():
    assert ptb_tokens("A runway (about 3 km), isn't it?") == [
        "a",
        "runway",
        "-lrb-",
        "about",
        "3",
        "km",
        "-rrb-",
        "is",
        "n't",
        "it",
    ]
    assert ptb_tokens("The port's 0.5m boats.") == ["the", "port", "'s", "0.5", "m", "boats"]
    assert TOKENIZERS["raw"]("Two  ships. ") == ["Two", "ships."]
