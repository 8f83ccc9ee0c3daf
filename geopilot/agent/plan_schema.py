"""Every plan valid by construction (docs/design.md §7): the think turn's grammar, compiled from the tool registry
with xgrammar, applied as a token mask over the whole vocabulary (in process) or sent as the request's
`response_format` (an OpenAI-compatible engine).

    {"reasoning":STRING,"actions":[{"tool":NAME,"params":<that tool's params schema>},...],"value":null|STRING}

`PlanConstraint` says which tools a plan may call, with which params schemas, and how many calls it needs
(`tool_choice`: none -> 0; auto -> any; required -> at least one; a named function -> only it; no parallel calls
-> at most one). `plan_json_schema` is its JSON schema (the wire format's keys in order; `value` null after calls,
a non-empty answer without them). `PlanGrammars` compiles it for one tokenizer (cached per constraint, i.e. per
tool set) and `PlanLogits` is the logits processor: one `GrammarMatcher` per constrained row of a batch, and within
the turn's last `CLOSE_WINDOW` tokens only the best few tokens after which the plan can still close in the room
left (else the shortest closing is written), so a constrained plan always parses within `max_new_tokens`.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from geopilot.boxes import BOX_KEYS, BOXES_KEY
from geopilot.errors import GeoPilotInputError, clipped
from geopilot.json_limits import check_tool_schema
from geopilot.sample import AssistantMessage

SEPARATORS = (",", ":")  # the wire format is compact JSON (geopilot.wire.dumps); xgrammar's default has ": "
ANY_PARAMS = json.dumps({"type": "object", "additionalProperties": True})  # a client tool this registry lacks
CLOSE_WINDOW = 64  # the last tokens of a turn in which every token must leave room to close the plan
WINDOW_CANDIDATES = 4  # the best allowed tokens checked for room there (sampling keeps its choice among them)
CLOSING_TEXTS = (b'"', b"]", b"}", b"null", b"{", b",", b"0", b"a")  # what the shortest closing prefers, in order
MAX_CLOSING_TOKENS = 256  # a closing longer than this is not searched further (no registry schema needs it)


@dataclass(frozen=True)
class PlanConstraint:
    """Which tools a plan may call (with each one's params JSON schema, as JSON text) and how many calls."""

    tools: tuple[str, ...]  # the names a call may use, in order
    min_calls: int = 0
    max_calls: int | None = None  # None: no limit
    params: tuple[tuple[str, str], ...] = ()  # (tool, its params JSON schema as JSON text); absent: any object

    def problem(self, plan: AssistantMessage) -> str | None:
        """What the parsed `plan` does that the constraint forbids (checked also where decoding was not
        constrained: the switch off, a server that ignores `response_format`)."""
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


def plan_json_schema(constraint: PlanConstraint, box_schema: dict | None = None) -> dict[str, Any]:
    """The JSON schema of a plan under `constraint`; each tool's `$defs` are renamed `<tool>.<name>` into one.
    `box_schema`: how the model writes a box (its family's `BOX_SCHEMA`), in place of every box param's own
    schema (an array under `geopilot.boxes.BOX_KEYS`, each item of one under `boxes`); None keeps them."""
    schemas = dict(constraint.params)
    defs: dict[str, Any] = {}
    calls = []
    for tool in constraint.tools:
        params = json.loads(schemas.get(tool, ANY_PARAMS))
        if box_schema is not None:
            params = _model_boxes(params, box_schema)
        for name, definition in params.pop("$defs", {}).items():
            defs[f"{tool}.{name}"] = _renamed_refs(definition, tool)
        calls.append(
            {
                "type": "object",
                "properties": {"tool": {"const": tool}, "params": _renamed_refs(params, tool)},
                "required": ["tool", "params"],
                "additionalProperties": False,
            }
        )
    branches = []
    if constraint.tools and constraint.max_calls != 0:
        actions: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
        if constraint.max_calls is not None:
            actions["maxItems"] = constraint.max_calls
        branches.append(_plan(actions, {"type": "null"}))
    if constraint.min_calls == 0:
        branches.append(_plan({"type": "array", "maxItems": 0}, {"type": "string", "minLength": 1}))
    schema = branches[0] if len(branches) == 1 else {"anyOf": branches}
    return {**schema, "$defs": defs} if defs else schema


def _plan(actions: dict, value: dict) -> dict:
    return {
        "type": "object",
        "properties": {"reasoning": {"type": "string"}, "actions": actions, "value": value},
        "required": ["reasoning", "actions", "value"],
        "additionalProperties": False,
    }


def _model_boxes(node, box_schema: dict):
    """A params schema with every box property's array schema (an `anyOf` branch too) replaced by `box_schema`."""
    if isinstance(node, list):
        return [_model_boxes(item, box_schema) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _model_boxes(value, box_schema) for key, value in node.items()}
    properties = out.get("properties")
    if isinstance(properties, dict):
        for name, schema in properties.items():
            if name in BOX_KEYS:
                properties[name] = _as_box(schema, lambda _: box_schema)
            elif name == BOXES_KEY:
                properties[name] = _as_box(schema, lambda array: {**array, "items": box_schema})
    return out


def _as_box(schema, replace):
    """`schema` with its array alternative(s) replaced (`replace(array schema)`); anything else as it is."""
    if isinstance(schema, dict) and schema.get("type") == "array":
        return replace(schema)
    if isinstance(schema, dict) and isinstance(schema.get("anyOf"), list):
        return {**schema, "anyOf": [_as_box(branch, replace) for branch in schema["anyOf"]]}
    return schema


def _renamed_refs(node, tool: str):
    """`#/$defs/X` -> `#/$defs/<tool>.X`, so two tools' definitions of the same name stay apart."""
    if isinstance(node, dict):
        return {
            k: (f"#/$defs/{tool}." + v[len("#/$defs/") :])
            if k == "$ref" and isinstance(v, str) and v.startswith("#/$defs/")
            else _renamed_refs(v, tool)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_renamed_refs(v, tool) for v in node]
    return node


def check_params_schema(tool: str, schema: dict) -> str:
    """A tool's params JSON schema as JSON text, once xgrammar compiled it (on a byte vocabulary: no tokenizer is
    needed); a schema it cannot compile raises ValueError naming the tool (at registry load, never mid-request)."""
    text = json.dumps(schema)  # the properties in their order: the order a plan writes them
    reason = _compile_problem(text)
    if reason is not None:
        raise ValueError(f"tool {tool!r}: its params schema cannot be compiled into the plan grammar: {reason}")
    return text


@functools.lru_cache(maxsize=512)
def _compile_problem(text: str) -> str | None:
    """Why xgrammar cannot compile the schema `text` (None: it can); cached, as every registry load checks again."""
    import xgrammar

    try:
        xgrammar.GrammarCompiler(_byte_vocabulary(), cache_enabled=False).compile_json_schema(
            text, any_whitespace=False, separators=SEPARATORS
        )
    except (RuntimeError, ValueError) as err:
        lines = str(err).strip().splitlines() or [type(err).__name__]
        return re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", lines[-1])  # xgrammar's "[time] file.cc:N: " prefix
    return None


def check_client_schema(tool: str, schema: object) -> str:
    """A client-declared params schema checked before anything compiles it: the size and depth limits of every
    client schema (`geopilot.json_limits.check_tool_schema`), no recursive `$ref`; then compiled as a registry
    tool's is. ValueError naming the tool otherwise (serving: a 400)."""
    check_tool_schema(schema, f"tool {clipped(tool)!r}: its parameters schema")
    if _recursive(schema):
        raise ValueError(f"tool {clipped(tool)!r}: its parameters schema is recursive ($ref)")
    return check_params_schema(tool, schema)


def _refs(node) -> set[str]:
    if isinstance(node, dict):
        own = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return own.union(*(_refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


def _recursive(schema: dict) -> bool:
    """A `$ref` to the root, or a definition that reaches itself through `$ref`s."""
    definitions = {f"#/{key}/{name}": d for key in ("$defs", "definitions") for name, d in schema.get(key, {}).items()}
    graph = {ref: _refs(d) for ref, d in definitions.items()}
    if "#" in _refs(schema):
        return True
    seen: set[str] = set()

    def reaches(ref: str, target: str) -> bool:
        for nxt in graph.get(ref, ()):
            if nxt == target:
                return True
            if nxt not in seen:
                seen.add(nxt)
                if reaches(nxt, target):
                    return True
        return False

    for ref in graph:
        seen.clear()
        if reaches(ref, ref):
            return True
    return False


_BYTES = None


def _byte_vocabulary():
    global _BYTES  # noqa: PLW0603 - one 256-token vocabulary for every schema check
    if _BYTES is None:
        import xgrammar

        _BYTES = xgrammar.TokenizerInfo([bytes([i]) for i in range(256)])
    return _BYTES


class PlanGrammars:
    """The plan grammars of one vocabulary (an `xgrammar.TokenizerInfo`), compiled once per constraint (a tool set
    and its tool_choice). `PlanGrammars.of(tokenizer, vocab_size)` for a transformers tokenizer."""

    def __init__(self, info, eos: int, box_schema: dict | None = None):
        import xgrammar

        self.info, self.eos, self.vocab_size = info, eos, info.vocab_size
        self.box_schema = box_schema  # how the model writes a box param (`plan_json_schema`)
        self.compiler = xgrammar.GrammarCompiler(info)
        self._compiled: dict[PlanConstraint, Any] = {}
        self._shortest: dict[PlanConstraint, int] = {}
        exact: dict[bytes, int] = {}
        for token, text in enumerate(self.info.decoded_vocab):
            exact.setdefault(bytes(text), token)
        self.exact = {text: token for text, token in exact.items() if text}  # the first id of each token text
        self.closers = [exact[t] for t in CLOSING_TEXTS if t in exact]
        # xgrammar's JSON strings admit raw control characters, which JSON (and json.loads) does not
        self.control = [t for t, text in enumerate(self.info.decoded_vocab) if any(b < 0x20 for b in bytes(text))]

    @classmethod
    def of(cls, tokenizer, vocab_size: int, box_schema: dict | None = None) -> PlanGrammars:
        """`vocab_size`: the model's logits width (the mask covers all of it, padding ids included)."""
        import xgrammar

        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        return cls(info, tokenizer.eos_token_id, box_schema)

    def compiled(self, constraint: PlanConstraint):
        if constraint not in self._compiled:
            import xgrammar

            schema = json.dumps(plan_json_schema(constraint, self.box_schema))
            plan = xgrammar.Grammar.from_json_schema(schema, any_whitespace=False, separators=SEPARATORS)
            space = xgrammar.Grammar.from_ebnf('root ::= " " | ""')  # the wire renders ` {json}` after ASSISTANT:
            self._compiled[constraint] = self.compiler.compile_grammar(xgrammar.Grammar.concat(space, plan))
        return self._compiled[constraint]

    def matcher(self, constraint: PlanConstraint):
        import xgrammar

        return xgrammar.GrammarMatcher(self.compiled(constraint))

    def shortest(self, constraint: PlanConstraint) -> int:
        """Tokens the shortest plan the closing search finds takes, its `</s>` included."""
        if constraint not in self._shortest:
            self._shortest[constraint] = len(self.closing(self.matcher(constraint))) + 1
        return self._shortest[constraint]

    def check_room(self, constraint: PlanConstraint, max_new_tokens: int) -> None:
        """GeoPilotInputError when no plan fits in `max_new_tokens`: a one-line error, not a cut plan."""
        need = self.shortest(constraint)
        if max_new_tokens < need:
            raise GeoPilotInputError(
                f"max_new_tokens={max_new_tokens} is too small for a plan: the shortest the plan grammar allows "
                f"takes {need} tokens"
            )

    def closing(self, matcher) -> list[int]:
        """A short token sequence that closes the plan from `matcher`'s state (which is left as it was): a forced
        stretch as its longest token, else the first allowed of `CLOSING_TEXTS`, else the first allowed token."""
        import torch
        import xgrammar

        twin, out = matcher.fork(), []
        mask = xgrammar.allocate_token_bitmask(1, self.vocab_size)
        for _ in range(MAX_CLOSING_TOKENS):
            twin.fill_next_token_bitmask(mask)
            if twin.is_completed() or _allowed(mask, self.eos):
                break
            token = self._forced(twin.find_jump_forward_string().encode(), mask)
            if token is None:
                token = next((t for t in self.closers if _allowed(mask, t)), None)
            if token is None:
                bits = ((mask[0].unsqueeze(-1) >> torch.arange(32, dtype=mask.dtype)) & 1).flatten()[: self.vocab_size]
                bits[self.control] = 0  # never closes with what JSON forbids
                token = int(bits.nonzero()[0])
            twin.accept_token(token)
            out.append(token)
        return out

    def _forced(self, text: bytes, mask) -> int | None:
        for end in range(len(text), 0, -1):
            token = self.exact.get(text[:end])
            if token is not None and _allowed(mask, token):
                return token
        return None


def _allowed(mask, token: int) -> bool:
    return bool((int(mask[0, token >> 5]) >> (token & 31)) & 1)


class PlanLogits:
    """A transformers logits processor keeping each constrained row of a batch inside its plan grammar, exactly
    over the whole vocabulary. `constraints[i]`: row i's constraint (None: not steered); one per generated turn."""

    def __init__(self, grammars: PlanGrammars, constraints: list[PlanConstraint | None], max_new_tokens: int):
        import xgrammar

        self.grammars, self.max_new_tokens = grammars, max_new_tokens
        self.matchers = [None if c is None else grammars.matcher(c) for c in constraints]
        self.mask = xgrammar.allocate_token_bitmask(len(constraints), grammars.vocab_size)
        self.forced: list[list[int]] = [[] for _ in constraints]
        self.fed = [0] * len(constraints)
        self.start: int | None = None

    def __call__(self, input_ids, scores):
        import torch
        import xgrammar

        if self.start is None:
            self.start = input_ids.shape[1]
        steps = input_ids.shape[1] - self.start
        rows = []
        for row, matcher in enumerate(self.matchers):
            if matcher is None:
                continue
            for token in input_ids[row, self.start + self.fed[row] :].tolist():
                if not matcher.is_terminated() and not matcher.accept_token(token):
                    self.matchers[row] = matcher = None  # a token from elsewhere (never from this mask): let go
                    break
            self.fed[row] = steps
            if matcher is None or matcher.is_terminated():
                continue
            matcher.fill_next_token_bitmask(self.mask, row)
            rows.append(row)
        if not rows:
            return scores
        xgrammar.apply_token_bitmask_inplace(scores, self.mask.to(scores.device), indices=rows)
        for row in rows:
            if self.matchers[row].is_completed():  # a whole plan ends here, even before min_new_tokens
                scores[row, self.grammars.eos] = 0.0
        if self.grammars.control:
            scores[torch.tensor(rows)[:, None], torch.tensor(self.grammars.control)[None, :]] = float("-inf")
        room = self.max_new_tokens - steps
        if room <= CLOSE_WINDOW:
            for row in rows:
                self._within_room(row, scores, room)
        return scores

    def _within_room(self, row: int, scores, room: int) -> None:
        """Near the end of the turn: of the `WINDOW_CANDIDATES` best allowed tokens, those after which the plan
        still closes in the room left (sampling picks among them as it would have), else the closing."""
        if not self.forced[row]:
            best = scores[row].topk(min(WINDOW_CANDIDATES, scores.shape[-1]))
            fitting = [
                token
                for value, token in zip(best.values.tolist(), best.indices.tolist(), strict=True)
                if value > float("-inf") and self._closes_after(row, token, room)
            ]
            if fitting:
                keep = scores[row, fitting].clone()
                scores[row] = float("-inf")
                scores[row, fitting] = keep
                return
            self.forced[row] = self.grammars.closing(self.matchers[row]) + [self.grammars.eos]
        self._only(row, scores, self.forced[row].pop(0))

    def _closes_after(self, row: int, token: int, room: int) -> bool:
        if token == self.grammars.eos:
            return True
        twin = self.matchers[row].fork()
        # after `token`, room - 1 steps are left for the closing tokens and </s>
        return twin.accept_token(token) and len(self.grammars.closing(twin)) + 1 <= room - 1

    @staticmethod
    def _only(row: int, scores, token: int) -> None:
        value = scores[row, token].clone()
        scores[row] = float("-inf")
        scores[row, token] = value if value > float("-inf") else 0.0
