"""What a run measures beyond what torchmetrics and sacreBLEU ship as one call.

AccuracyByPosition: accuracy at each target class, NaN where nothing was seen.

Scores of generated text against references (one reference each), over a whole corpus:
translation: BLEU and chrF, sacreBLEU's own (its defaults: 13a tokenization, exp smoothing;
    0-100), on detokenized hypotheses against the raw references.
dialogue: BLEU-1 and BLEU-4 (sacreBLEU with max n-gram order 1 and 4, otherwise as above);
    ROUGE-L F1 (torchmetrics' rouge_score, its default tokenizer: lower case, punctuation
    dropped; 0-100); distinct-1 and distinct-2 (Li et al. 2016, arXiv 1510.03055: distinct
    n-grams over all n-grams of all responses, whitespace tokens); and the length ratio, mean
    response length over mean reference length (whitespace tokens).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from sacrebleu.metrics import BLEU, CHRF
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.functional.text.rouge import rouge_score


class AccuracyByPosition(Metric):
    """Accuracy of the predictions at each target class, with the count behind each.

    In the probe the class of a token is its position, so this is accuracy by position;
    unlike MulticlassAccuracy(average=None) it reports NaN, not 0, where nothing was seen.
    """

    full_state_update = False

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.add_state("correct", torch.zeros(num_classes), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros(num_classes), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        self.correct += torch.bincount(target[preds == target], minlength=len(self.total))
        self.total += torch.bincount(target, minlength=len(self.total))

    def compute(self) -> Tensor:
        return self.correct / self.total


Scorer = Callable[[Sequence[str], Sequence[str]], dict[str, float]]


def distinct(texts: Sequence[str], n: int) -> float:
    """Distinct n-grams over all n-grams of all texts (0 when there are none)."""
    grams = [
        tuple(words[i : i + n])
        for words in map(str.split, texts)
        for i in range(len(words) - n + 1)
    ]
    return len(set(grams)) / len(grams) if grams else 0.0


def length_ratio(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    reference_words = sum(len(text.split()) for text in references)
    return sum(len(text.split()) for text in hypotheses) / max(reference_words, 1)


def translation_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    refs = [list(references)]
    return {
        "bleu": BLEU().corpus_score(list(hypotheses), refs).score,
        "chrf": CHRF().corpus_score(list(hypotheses), refs).score,
    }


def dialogue_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    refs = [list(references)]
    rouge = rouge_score(list(hypotheses), list(references), rouge_keys="rougeL")
    return {
        "bleu1": BLEU(max_ngram_order=1).corpus_score(list(hypotheses), refs).score,
        "bleu4": BLEU(max_ngram_order=4).corpus_score(list(hypotheses), refs).score,
        "rougeL": 100 * float(rouge["rougeL_fmeasure"]),
        "distinct1": distinct(hypotheses, 1),
        "distinct2": distinct(hypotheses, 2),
        "length_ratio": length_ratio(hypotheses, references),
    }


SCORERS: dict[str, Scorer] = {"translation": translation_scores, "dialogue": dialogue_scores}


def signatures(kind: str) -> dict[str, str]:
    """sacreBLEU's signatures of the scores of `kind` (sacreBLEU states one only once it has
    scored something)."""
    metrics = (
        {"bleu": BLEU(), "chrf": CHRF()}
        if kind == "translation"
        else {"bleu1": BLEU(max_ngram_order=1), "bleu4": BLEU(max_ngram_order=4)}
    )
    found = {}
    for name, metric in metrics.items():
        metric.corpus_score(["a"], [["a"]])
        order = f"|order:{metric.max_ngram_order}" if isinstance(metric, BLEU) else ""
        found[name] = f"{metric.get_signature()}{order}"  # sacreBLEU's leaves the order out
    return found
