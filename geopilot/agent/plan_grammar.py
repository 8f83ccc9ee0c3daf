"""Constrained plans for client-run tools: the think turn is decoded inside the wire format's grammar, with the
calls `tool_choice` allows.

    {"reasoning":STRING,"actions":[{"tool":"NAME","params":OBJECT},...],"value":null|STRING}

`PlanConstraint` says which tools a plan may call and how many calls it needs (`none`: 0; `auto`: any of the
declared tools; `required`: at least one; a named function: only that one; `parallel_tool_calls: false`: at most
one). `PlanState` is a character-level automaton of that grammar (compact JSON, one leading space allowed): it
says whether a text can still become a valid plan and the shortest text that closes it. `ConstrainedPlans` is
the logits processor that keeps each row's turn inside it: of the most likely tokens it allows only those whose
text keeps the plan viable (all tokens when none of them does), `</s>` only once the plan is closed, byte-fallback
tokens only next to their own kind (so the decoded text is the text the grammar read), and when the turn would
otherwise run out of `max_new_tokens` it writes the closing text, so a constrained plan always parses.
Sampling is thereby limited to the `TOP_CANDIDATES` most likely tokens at each step.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

from geopilot.sample import AssistantMessage

TOP_CANDIDATES = 64  # tokens checked against the grammar per step before falling back to the whole vocabulary
NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
# what can still become a NUMBER: a number's characters in any order ("97e297e2") would never close
NUMBER_PREFIX = re.compile(r"-?((0|[1-9][0-9]*)(\.[0-9]*|\.[0-9]+[eE][+-]?[0-9]*|[eE][+-]?[0-9]*)?)?")
HEX = set("0123456789abcdefABCDEF")
STRING_BYTE = "\x80"  # stands for a byte-fallback token of a multi-byte character (valid inside strings only)


@dataclass(frozen=True)
class PlanConstraint:
    """Which tools a plan may call and how many calls it must make."""

    tools: tuple[str, ...]  # the names a call may use (in the order the client declared them)
    min_calls: int = 0
    max_calls: int | None = None  # None: no limit
    params: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (tool, the only top-level param names it takes)

    def param_names(self, tool: str) -> tuple[str, ...] | None:
        return dict(self.params).get(tool)

    def problem(self, plan: AssistantMessage) -> str | None:
        """What the parsed `plan` does that the constraint forbids (checked also where decoding was not
        constrained: an HTTP engine, a plan written outside the grammar)."""
        calls = [a.tool for a in plan.actions]
        if len(calls) < self.min_calls:
            need = self.tools[0] if len(self.tools) == 1 else "one of " + ", ".join(self.tools)
            return f"tool_choice: the reply must call {need}"
        if self.max_calls is not None and len(calls) > self.max_calls:
            return "tool_choice: the reply must not call a tool" if self.max_calls == 0 else "at most one call"
        outside = [name for name in calls if name not in self.tools]
        if outside:
            return f"unknown_tool: {', '.join(outside)} is not among the tools offered ({', '.join(self.tools)})"
        return None


class PlanState:
    """The grammar as a stack of frames, fed one character at a time. Frames (top last):
    lit (text, position), str (escape state), name (text so far), calls (count, expecting), value (object only?),
    obj (expecting), arr (expecting), num (text), space (an optional leading space), field (null or a string)."""

    def __init__(self, constraint: PlanConstraint):
        self.constraint, self.calls, self.tool = constraint, 0, ""
        self.stack: list[list] = [
            ["lit", "}", 0],
            ["field"],
            ["lit", ',"value":', 0],
            ["calls", 0, "first"],
            ["lit", ',"actions":[', 0],
            ["str", 0],
            ["lit", '{"reasoning":"', 0],
            ["space"],
        ]

    @property
    def done(self) -> bool:
        return not self.stack

    def copy(self) -> PlanState:
        twin = copy.copy(self)
        twin.stack = [list(frame) for frame in self.stack]
        return twin

    def feed_text(self, text: str) -> bool:
        return all(self.feed(char) for char in text)

    def feed(self, char: str) -> bool:
        """Consume one character; False when no valid plan continues with it (the state is then undefined)."""
        while self.stack:
            frame = self.stack[-1]
            kind = frame[0]
            if kind == "space":
                self.stack.pop()
                if char == " ":
                    return True
                continue
            if kind == "num":
                if NUMBER_PREFIX.fullmatch(frame[1] + char):
                    frame[1] += char
                    return True
                if not NUMBER.fullmatch(frame[1]):
                    return False
                self.stack.pop()
                continue  # the character belongs to what follows the number
            return getattr(self, "_" + kind)(frame, char)
        return False  # the plan is closed: nothing may follow

    def _lit(self, frame, char: str) -> bool:
        text, at = frame[1], frame[2]
        if text[at] != char:
            return False
        frame[2] += 1
        if frame[2] == len(text):
            self.stack.pop()
        return True

    def _str(self, frame, char: str) -> bool:
        state = frame[1]  # 0 plain, -1 after a backslash, n > 0: n hex digits of a \u escape to come
        if len(frame) > 2:  # a string that must not be empty (the answer of a plan without calls)
            if char == '"':
                return False
            frame.pop()
        if state == -1:
            if char == "u":
                frame[1] = 4
                return True
            frame[1] = 0
            return char in '"\\/bfnrt'
        if state > 0:
            frame[1] -= 1
            return char in HEX
        if char == '"':
            self.stack.pop()
            return True
        if char == "\\":
            frame[1] = -1
            return True
        return char >= " "

    def _name(self, frame, char: str) -> bool:
        """A tool name (one of the constraint's), or a param name (`frame[2]`: the tool's own, when it says)."""
        names = frame[2] if len(frame) > 2 else self.constraint.tools
        if char == '"':
            if frame[1] not in names:
                return False
            if len(frame) == 2:
                self.tool = frame[1]
            self.stack.pop()
            return True
        frame[1] += char
        return any(name.startswith(frame[1]) for name in names)

    def _calls(self, frame, char: str) -> bool:
        count, expecting = frame[1], frame[2]
        limit = self.constraint.max_calls
        if char == "]" and expecting != "open" and count >= self.constraint.min_calls:
            self.stack.pop()
            return True
        if char == "{" and expecting != "sep" and (limit is None or count < limit) and self.constraint.tools:
            frame[1], frame[2] = count + 1, "sep"
            self.calls = count + 1
            self.stack += [["lit", "}", 0], ["value", True], ["lit", ',"params":', 0], ["name", ""]]
            self.stack.append(["lit", '"tool":"', 0])
            return True
        if char == "," and expecting == "sep":
            frame[2] = "open"
            return True
        return False

    def _field(self, frame, char: str) -> bool:
        """`value`: null after calls, else the answer (a non-empty string)."""
        self.stack.pop()
        if char == "n" and self.calls:
            self.stack.append(["lit", "ull", 0])
            return True
        if char == '"' and not self.calls:
            self.stack.append(["str", 0, "non-empty"])
            return True
        return False

    def _value(self, frame, char: str) -> bool:
        object_only = frame[1]  # True: a call's params, whose names the tool may fix
        self.stack.pop()
        if char == "{":
            names = self.constraint.param_names(self.tool) if object_only is True else None
            self.stack.append(["obj", "first"] + ([names] if names is not None else []))
            return True
        if object_only:
            return False
        if char == "[":
            self.stack.append(["arr", "first"])
        elif char == '"':
            self.stack.append(["str", 0])
        elif NUMBER_PREFIX.fullmatch(char):  # "-" or an ASCII digit (str.isdigit would take "²")
            self.stack.append(["num", char])
        elif char in "tfn":
            self.stack.append(["lit", {"t": "rue", "f": "alse", "n": "ull"}[char], 0])
        else:
            return False
        return True

    def _obj(self, frame, char: str) -> bool:
        expecting = frame[1]
        if char == "}" and expecting in ("first", "sep"):
            self.stack.pop()
            return True
        if char == '"' and expecting in ("first", "key") and (len(frame) == 2 or frame[2]):
            frame[1] = "sep"
            key = ["name", "", frame[2]] if len(frame) > 2 else ["str", 0]
            self.stack += [["value", False], ["lit", ":", 0], key]
            return True
        if char == "," and expecting == "sep":
            frame[1] = "key"
            return True
        return False

    def _arr(self, frame, char: str) -> bool:
        expecting = frame[1]
        if char == "]" and expecting in ("first", "sep"):
            self.stack.pop()
            return True
        if char == "," and expecting == "sep":
            self.stack.append(["value", False])
            return True
        if expecting == "first":
            frame[1] = "sep"
            self.stack.append(["value", False])
            return self.feed(char)
        return False

    def completion(self) -> str:
        """The shortest text (near enough) that closes the plan from here."""
        first_tool = self.constraint.tools[0] if self.constraint.tools else ""
        call = '{"tool":"' + first_tool + '","params":{}}'
        out, calls = [], self.calls
        for frame in reversed(self.stack):
            kind = frame[0]
            if kind == "lit":
                out.append(frame[1][frame[2] :])
            elif kind == "str":
                opened = "?" if len(frame) > 2 else ""
                out.append(opened + {-1: 'n"', 0: '"'}.get(frame[1], "0" * max(frame[1], 0) + '"'))
            elif kind == "name":
                names = frame[2] if len(frame) > 2 else self.constraint.tools
                match = next(n for n in names if n.startswith(frame[1]))
                out.append(match[len(frame[1]) :] + '"')
            elif kind == "calls":
                needed = frame[2] == "open" or (frame[2] == "first" and frame[1] < self.constraint.min_calls)
                out.append((call if needed else "") + "]")
                calls += needed
            elif kind == "value":
                out.append("{}" if frame[1] else "null")
            elif kind == "obj":
                if frame[1] != "key":
                    out.append("}")
                else:  # after a comma, so a name was allowed before: one is allowed again
                    out.append('"' + (frame[2][0] if len(frame) > 2 else "_") + '":null}')
            elif kind == "arr":
                out.append("]")
            elif kind == "num":
                out.append("" if NUMBER.fullmatch(frame[1]) else "0")
            elif kind == "field":
                out.append("null" if calls else '"?"')
        return "".join(out)


def token_texts(tokenizer) -> list[str | None]:
    """The text each token id adds (SentencePiece `▁` as a space, byte tokens as their character; `STRING_BYTE`
    for a byte of a multi-byte character); None for special tokens, which a plan never contains."""
    return _token_table(tokenizer)[0]


def byte_kinds(tokenizer) -> list[int]:
    """Per token id: 0 not a byte-fallback token, 1 a byte below 0x80, 2 a byte of a multi-byte character. The
    decoder reads a run of byte tokens as one UTF-8 sequence and, when it is not valid, writes one U+FFFD per byte:
    `<0xE2><0x22>` decodes to two of them, not to a character and a quote."""
    return _token_table(tokenizer)[1]


def _token_table(tokenizer) -> tuple[list[str | None], list[int]]:
    cached = getattr(tokenizer, "_geopilot_token_table", None)
    if cached is not None:
        return cached
    special = set(tokenizer.all_special_ids) | {
        i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if t.special
    }
    texts: list[str | None] = []
    kinds: list[int] = []
    for index, piece in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))):
        kind = 0
        if index in special or piece is None:
            texts.append(None)
        elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece):
            value = int(piece[3:5], 16)
            texts.append(chr(value) if value < 0x80 else STRING_BYTE)
            kind = 1 if value < 0x80 else 2
        else:
            texts.append(piece.replace("\u2581", " "))
        kinds.append(kind)
    tokenizer._geopilot_token_table = texts, kinds
    return texts, kinds


class ConstrainedPlans:
    """A transformers logits processor keeping each constrained row of a batch inside its plan grammar.
    `constraints[i]` is row i's constraint (None: unconstrained); one instance serves one generated turn."""

    def __init__(self, constraints: list[PlanConstraint | None], tokenizer, max_new_tokens: int):
        self.constraints, self.max_new_tokens = constraints, max_new_tokens
        self.texts, self.kinds = token_texts(tokenizer), byte_kinds(tokenizer)
        self.eos = tokenizer.eos_token_id
        self.states = [None if c is None else PlanState(c) for c in constraints]
        self.fed = [0] * len(constraints)
        self.start: int | None = None

    def __call__(self, input_ids, scores):
        import torch

        if self.start is None:
            self.start = input_ids.shape[1]
        steps = input_ids.shape[1] - self.start
        for row, state in enumerate(self.states):
            if state is None:
                continue
            for token in input_ids[row, self.start + self.fed[row] :].tolist():
                text = self.texts[token] if token != self.eos else None
                if text is None or not state.feed_text(text):
                    self.states[row] = state = None  # left the grammar (or ended): no longer steered
                    break
            self.fed[row] = steps
            if state is None:
                continue
            after = self.kinds[int(input_ids[row, -1])] if steps else 0
            allowed = self._allowed(state, scores[row], self.max_new_tokens - steps, after)
            keep = torch.full_like(scores[row], float("-inf"))
            keep[allowed] = scores[row][allowed]
            scores[row] = keep
        return scores

    def _allowed(self, state: PlanState, scores, room: int, after: int) -> list[int]:
        """`after`: the byte kind of the row's last token (a byte token of the other kind may not follow it)."""
        if state.done:
            return [self.eos]
        closing = state.completion()
        if room <= len(closing) + 1:  # every closing token writes >= 1 character: force the closing text
            fitting = [i for i, t in enumerate(self.texts) if t and closing.startswith(t) and self._joins(after, i)]
            return [max(fitting, key=lambda i: len(self.texts[i]))] if fitting else [self.eos]
        order = scores.argsort(descending=True).tolist()
        for candidates in (order[:TOP_CANDIDATES], order[TOP_CANDIDATES:]):
            viable = [i for i in candidates if self._joins(after, i) and self._viable(state, i)]
            if viable:
                return viable
        return [self.eos]  # cannot happen: some token continues every open frame

    def _joins(self, after: int, token: int) -> bool:
        """Byte tokens of one kind only next to each other: then a run decodes to the characters the grammar read
        (one ASCII byte each, or non-ASCII characters / U+FFFD inside a string)."""
        kind = self.kinds[token] if token < len(self.kinds) else 0
        return not (after and kind and kind != after)

    def _viable(self, state: PlanState, token: int) -> bool:
        text = self.texts[token] if token < len(self.texts) else None
        return bool(text) and state.copy().feed_text(text)
