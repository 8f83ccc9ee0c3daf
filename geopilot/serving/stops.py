"""`stop` sequences (OpenAI's request field, FastChat's `stop`): the answer a client sees ends before the first
occurrence of any of them, which is not included.

They apply to the answer text, not to the model's turns: a GeoPilot turn is one JSON object that must close to
parse, so the model still finishes its turn (and its tool calls have run); only what is returned is cut.
Streaming holds back the last `len(longest stop) - 1` characters until they cannot begin a stop sequence.
"""

from __future__ import annotations


def cut(text: str, stops: list[str]) -> str:
    """`text` up to (not including) the earliest stop sequence in it; all of it when there is none."""
    ends = [at for stop in stops if (at := text.find(stop)) >= 0]
    return text[: min(ends)] if ends else text


class StopFilter:
    """Streamed pieces in, the pieces a client may be sent out; `stopped` once a stop sequence appeared."""

    def __init__(self, stops: list[str]):
        self.stops, self.text, self.sent, self.stopped = stops, "", 0, False
        self.hold = max((len(s) for s in stops), default=1) - 1

    def feed(self, piece: str) -> str:
        if self.stopped:
            return ""
        self.text += piece
        kept = cut(self.text, self.stops)
        if len(kept) < len(self.text):
            self.stopped = True
            safe = len(kept)
        else:
            safe = max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent : safe], safe
        return out
