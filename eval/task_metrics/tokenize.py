"""Caption tokenisation: two named rule sets, chosen once per evaluation (`TOKENIZERS`).

- `raw` (default, SARLANG-1M's official `Evaluate_caption.py`): the string split on whitespace, case and punctuation
  kept. SARLANG passes raw strings straight to pycocoevalcap's scorers, which split on spaces; the paper's captioning
  table follows that protocol.
- `ptb`: a pure-Python rule set in the spirit of COCO's Java `PTBTokenizer -preserveLines -lowerCase` followed by
  pycocoevalcap's punctuation drop. Rules, in order: lower case; brackets become PTB's escaped tokens, which survive
  the drop because it only lists upper-case escapes (`( ) [ ] { }` -> `-lrb- -rrb- -lsb- -rsb- -lcb- -rcb-`);
  double quotes become `` `` `` / `''`; a number glued to a unit splits (`0.5m` -> `0.5 m`); the clitics `n't 's 're
  've 'll 'd 'm` split off; `, ; : ! ? ...` and a sentence-final `.` split off; then the tokens
  `'' ' `` ` . ? ! , : - -- ... ;` are dropped. It is an approximation, not Stanford's tokenizer: abbreviations such
  as `m.` at a sentence end keep no dot here (PTB keeps `m.`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

PTB_DROP = {"''", "'", "``", "`", ".", "?", "!", ",", ":", "-", "--", "...", ";"}
_BRACKETS = {"(": " -lrb- ", ")": " -rrb- ", "[": " -lsb- ", "]": " -rsb- ", "{": " -lcb- ", "}": " -rcb- "}
_RULES: list[tuple[re.Pattern, str]] = [
    (re.compile(r'^"'), " `` "),
    (re.compile(r'(?<=[\s(\[{])"'), " `` "),
    (re.compile(r'"'), " '' "),
    (re.compile(r"(\d)([a-z]+)\b"), r"\1 \2"),  # 0.5m -> 0.5 m, 10km -> 10 km
    (re.compile(r"([a-z])(n't)\b"), r"\1 \2"),
    (re.compile(r"([a-z])('s|'re|'ve|'ll|'d|'m)\b"), r"\1 \2"),
    (re.compile(r"\.\.\."), " ... "),
    (re.compile(r"([,;:!?])"), r" \1 "),
    (re.compile(r"(?<!\d)\.(?!\d)"), " . "),  # a dot that is not a decimal point
    (re.compile(r"(\d)\.(?!\d)"), r"\1 . "),
    (re.compile(r"'(?=\s|$)"), " ' "),  # a closing quote
    (re.compile(r"(?:^|(?<=\s))'(?!(?:s|re|ve|ll|d|m)\b)"), " ' "),  # an opening quote, not a clitic
    (re.compile(r"(?<=\w)--(?=\w)"), " -- "),
]


def raw_tokens(text: str) -> list[str]:
    return text.split()


def ptb_tokens(text: str) -> list[str]:
    text = text.lower()
    for bracket, escaped in _BRACKETS.items():
        text = text.replace(bracket, escaped)
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    return [token for token in text.split() if token not in PTB_DROP]


TOKENIZERS: dict[str, Callable[[str], list[str]]] = {"raw": raw_tokens, "ptb": ptb_tokens}
