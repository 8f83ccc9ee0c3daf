"""The agent (paper Algorithm 1, docs/design.md §7): `GeoPilot.from_pretrained(dir).chat(image, query) -> ChatResult`.

One chat: load the image once; generate the think turn; parse it (`geopilot.plan_parser`); validate each call
against the registry (unknown tool, invalid params, wrong modality); run the calls (per-call timeout, failures
captured by `ToolRegistry.call`); feed the outputs back through THE formatter (`wire.format_tool_turn`); generate
the answer. A plan that cannot be parsed or validated gets ONE repair turn (`wire.format_repair_turn`); if the
repaired reply is still unparsable its text is the answer, and if its calls are still invalid they run as failed
calls the model answers from, with the error recorded either way. Nothing the model emits makes `chat` raise; bad
user input raises GeoPilotInputError.

Modality: a caller who declares `modality="optical"|"sar"` gets every call checked against it (a SAR tool on a
declared optical image is a `wrong_modality` problem). Undeclared (`modality=None`, the default), the modality is
inferred from the pixels (`geopilot.image.infer_modality`: no colour -> SAR) and reported in
`ChatResult.modality`, but no call is rejected for it: a heuristic must not veto a correct tool choice.

One file each: `requests` (input checks), `results` (what a chat returns), `loop` (one request's loop, fed a turn
at a time), `engine` (the engine protocol + the in-process KV-cache engine), `http_engine` (an OpenAI-compatible
server as the engine), `streaming` (`chat_stream`), `pilot` (`GeoPilot`: the one loop over either engine),
`plan_schema` (every think turn decoded inside the plan grammar compiled from the registry, xgrammar),
`client_tools` + `prefix_cache` (client-run tools: the plan handed back, decoded inside the grammar `tool_choice`
allows, its KV cache kept for the request that brings the results).
"""

from geopilot.agent.client_tools import ClientTools
from geopilot.agent.pilot import DEFAULT_CHAT_TIMEOUT_S, MIN_TURN_TOKENS, GeoPilot
from geopilot.agent.prefix_cache import PrefixCache
from geopilot.agent.requests import ChatRequest
from geopilot.agent.results import ChatResult, Timings, TokenCounts, ToolCallRecord, TurnRecord
from geopilot.agent.streaming import AnswerStream
from geopilot.generation import GenerationOptions

__all__ = [
    "DEFAULT_CHAT_TIMEOUT_S",
    "MIN_TURN_TOKENS",
    "AnswerStream",
    "ChatRequest",
    "ChatResult",
    "ClientTools",
    "GenerationOptions",
    "GeoPilot",
    "PrefixCache",
    "TokenCounts",
    "Timings",
    "ToolCallRecord",
    "TurnRecord",
]
