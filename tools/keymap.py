r"""Checkpoint key renames by ordered rules: how the specialist backends translate upstream names into ours.

    upstream_key_to_ours = KeyRenames([
        (r"neck\.fpn_convs\.3\.conv\.", "neck.extra_convs.0."),          # a template (\1 group references allowed)
        (r"res_block(\d+)\.group1\.", lambda m: f"blocks.{int(m[1]) - 1}."),  # or a function of the match
        (r"bbox_head\.integral\.project$", None),                        # None: dropped on purpose
    ])
    upstream_key_to_ours("neck.fpn_convs.3.conv.weight")  # -> "neck.extra_convs.0.weight"

Patterns are anchored at the start of the key and the first one that matches wins: the part it matched is replaced
and the rest of the key is kept. A key no rule matches is returned unchanged, so a strict load names it as unexpected.
`geopilot.tools.weights.remap_keys(state, renames)` applies it to a whole state dict. Torch-free.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

Replacement = str | Callable[[re.Match[str]], str] | None


class KeyRenames:
    def __init__(self, rules: Iterable[tuple[str, Replacement]]) -> None:
        self.rules = [(re.compile(pattern), replacement) for pattern, replacement in rules]

    def __call__(self, key: str) -> str | None:
        for pattern, replacement in self.rules:
            match = pattern.match(key)
            if match is None:
                continue
            if replacement is None:
                return None
            head = replacement(match) if callable(replacement) else match.expand(replacement)
            return head + key[match.end() :]
        return key

    def knows(self, key: str) -> bool:
        """Whether a rule matches `key` (for a caller that treats a key no rule knows as an error)."""
        return any(pattern.match(key) for pattern, _ in self.rules)


def under(upstream: str, ours: str, members: dict[str, str]) -> list[tuple[str, str]]:
    """The rules for the members of one module: `upstream + name` -> `ours + new name` for each member."""
    return [(upstream + name, ours + new) for name, new in members.items()]
