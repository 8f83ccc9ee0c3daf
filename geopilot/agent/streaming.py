"""`chat_stream`: the chat runs in a worker thread and hands answer text pieces to the consumer as decoded."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

from geopilot.agent.results import ChatResult


class AnswerStream:
    """An iterator over answer text pieces, run in a worker thread; `.result` is the ChatResult at the end."""

    _END = object()

    def __init__(self, run: Callable[[Callable[[str], None]], ChatResult]):
        self.result: ChatResult | None = None
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, args=(run,), daemon=True)
        self._thread.start()

    def _work(self, run) -> None:
        try:
            self.result = run(self._queue.put)
        except BaseException as err:  # noqa: BLE001 - re-raised in the consumer's thread
            self._error = err
        finally:
            self._queue.put(self._END)

    def __iter__(self) -> Iterator[str]:
        while (item := self._queue.get()) is not self._END:
            yield item
        self._thread.join()
        if self._error is not None:
            raise self._error
