"""Deterministic text checks of an answer: normalised keywords and synonym groups, scoped forbidden terms, and
numbers attached to the nearest label with a tolerance (decimal commas and units understood)."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

# A forbidden term does not fire inside these benign phrases ("margin of error" must not fail "error").
BENIGN_CONTEXTS: dict[str, tuple[str, ...]] = {
    "error": (
        "margin of error",
        "standard error",
        "error bar",
        "error bars",
        "error margin",
        "measurement error",
        "no error",
        "without error",
        "mean absolute error",
        "root mean square error",
    ),
    "fail": ("fail safe",),
    "unknown": ("unknown unknowns",),
}

NUMBER = re.compile(r"(?<![\w.,])[-+\u2212]?\d+(?:,\d{3}(?!\d))*(?:[.,]\d+)?")  # 1,500 / 12.5 / 12,5 / -3
UNIT = re.compile(r"\s?(%|per ?cent|pp|percentage points?|km²|km2|km|m²|m2|ha|px|pixels?|m)(?!\w)")


def normalise(text: str) -> str:
    """NFKD, accents stripped, casefolded; hyphens, underscores and punctuation (except % and .) become spaces."""
    decomposed = unicodedata.normalize("NFKD", text)
    stripped = "".join(ch for ch in decomposed if not unicodedata.combining(ch)).casefold()
    return " ".join(re.sub(r"[^\w%.]+|_", " ", stripped).split())


def singular(word: str) -> str:
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("es") and word[-3] in "sxh":
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def normalise_term(text: str) -> str:
    """`normalise` with each word made singular: "Storage-Tanks" ~ "storage tank"."""
    return " ".join(singular(word) for word in normalise(text).replace(".", " ").split())


def contains_term(text: str, term: str) -> bool:
    """Whole-word, normalised, plural-insensitive containment."""
    return f" {normalise_term(term)} " in f" {normalise_term(text)} "


def keyword_present(answer: str, keyword: str | list[str]) -> bool:
    """A keyword, or any member of a synonym group (a list), appears in the answer as whole words."""
    group = keyword if isinstance(keyword, list) else [keyword]
    return any(contains_term(answer, alternative) for alternative in group)


def forbidden_present(answer: str, term: str) -> bool:
    """The forbidden term appears as whole words outside the benign phrases listed for it."""
    text = f" {normalise_term(answer)} "
    target = normalise_term(term)
    for phrase in BENIGN_CONTEXTS.get(target, ()):
        text = text.replace(f" {normalise_term(phrase)} ", " ")
    return f" {target} " in text


@dataclass(frozen=True)
class Number:
    value: float
    start: int
    unit: str | None


def parse_number(token: str) -> float:
    """ "1,500" -> 1500; "12,5" -> 12.5 (a decimal comma); "−3" -> -3."""
    token = token.replace("\u2212", "-")
    if re.fullmatch(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?", token):
        token = token.replace(",", "")
    return float(token.replace(",", "."))


def extract_numbers(text: str) -> list[Number]:
    numbers = []
    for match in NUMBER.finditer(text):
        unit_match = UNIT.match(text, match.end())
        unit = unit_match.group(1) if unit_match else None
        numbers.append(Number(parse_number(match.group()), match.start(), unit))
    return numbers


def label_positions(text: str, label: str) -> list[int]:
    """Character offsets of the label in the text (case-insensitive, whole words, plural-insensitive)."""
    words = [re.escape(singular(w)) + r"(?:s|es)?" for w in normalise(label).split()]
    pattern = re.compile(r"(?<!\w)" + r"[\s_\-]+".join(words) + r"(?!\w)", re.IGNORECASE)
    return [m.start() for m in pattern.finditer(strip_accents(text))]


def strip_accents(text: str) -> str:
    """Each character by its base letter ("Añora" -> "Anora"), one for one, so offsets stay those of `text`."""
    return "".join(
        next((c for c in unicodedata.normalize("NFKD", ch) if not unicodedata.combining(c)), ch)[:1] for ch in text
    )


CLAUSE_BREAK = re.compile(r"[;,]\s|\.\s|\band\b|\bwhile\b|\bwhereas\b")


def _clause(text: str, position: int) -> int:
    return sum(1 for m in CLAUSE_BREAK.finditer(text) if m.start() < position)


def numbers_by_label(text: str, labels: list[str]) -> dict[str, list[float]]:
    """Each number in the text, attached to the nearest label occurrence in either direction, preferring a
    label in the same clause ("water covers 12 % and trees 40 %": 12 -> water, 40 -> trees).

    With a single label that the text never mentions, every number is attached to it (a one-number answer
    need not repeat the label)."""
    numbers = extract_numbers(text)
    attached: dict[str, list[float]] = {label: [] for label in labels}
    positions = {label: label_positions(text, label) for label in labels}
    if len(labels) == 1 and not positions[labels[0]]:
        attached[labels[0]] = [n.value for n in numbers]
        return attached
    for number in numbers:
        clause = _clause(text, number.start)
        best = min(
            (
                (_clause(text, pos) != clause, abs(pos - number.start), label)
                for label in labels
                for pos in positions[label]
            ),
            default=None,
        )
        if best is not None:
            attached[best[2]].append(number.value)
    return attached
