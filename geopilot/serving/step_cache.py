"""The per-step scheduler's decoding batch: the KV of every decoding row in one left-padded cache, kept from step to
step. A row that joins has its own cache padded in; rows that leave are compacted away with one `index_select` per
layer at the next step; the batch is never rebuilt from every row's cache (that rebuild, at every change of rows,
was a quarter of the step loop's time on the tiny model)."""

from __future__ import annotations

from typing import Any


class StepBatch:
    """`rows` (anything with a `length`: the tokens of it the cache holds) and their left-padded `cache`."""

    def __init__(self, config):
        self.config = config  # the model's, for the DynamicCache it builds
        self.rows: list[Any] = []
        self.cache = None  # a DynamicCache of len(rows), or None while empty
        self._gone: list[Any] = []  # rows that left since the last `hold`

    @property
    def width(self) -> int:
        return 0 if self.cache is None else self.cache.layers[0].keys.shape[-2]

    def __contains__(self, row) -> bool:
        return any(row is r for r in self.rows) and not any(row is r for r in self._gone)

    def take_out(self, row):
        """`row`'s own cache (its part, without the padding), a DynamicCache of batch 1; it leaves the batch."""
        from transformers import DynamicCache

        i = next(i for i, r in enumerate(self.rows) if r is row)
        own = [
            (layer.keys[i : i + 1, :, -row.length :].clone(), layer.values[i : i + 1, :, -row.length :].clone())
            for layer in self.cache.layers
        ]
        self.drop(row)
        return DynamicCache(ddp_cache_data=own, config=self.config)

    def drop(self, row) -> None:
        """`row` leaves the batch (its KV is freed at the next `hold`)."""
        if row in self:
            self._gone.append(row)

    def hold(self, rows: list[Any]) -> None:
        """Make the batch hold exactly `rows`: those that left are compacted away, those that are new join with
        `row.cache` (their own, which the batch then holds: it is set to None)."""
        import torch

        staying = [i for i, r in enumerate(self.rows) if r in self and any(r is a for a in rows)]
        if len(staying) < len(self.rows):
            self._compact(staying)
        self._gone = []
        joining = [r for r in rows if r not in self]
        if not joining:
            return
        width = max([self.width] + [r.length for r in joining])
        layers = []
        for n in range(len(joining[0].cache.layers)):
            keys, values = [], []
            if self.cache is not None:
                keys.append(_left_pad(self.cache.layers[n].keys, width - self.width))
                values.append(_left_pad(self.cache.layers[n].values, width - self.width))
            for row in joining:
                layer = row.cache.layers[n]
                keys.append(_left_pad(layer.keys, width - row.length))
                values.append(_left_pad(layer.values, width - row.length))
            layers.append((torch.cat(keys), torch.cat(values)))
        if self.cache is None:
            from transformers import DynamicCache

            self.cache = DynamicCache(ddp_cache_data=layers, config=self.config)
        else:
            for layer, (k, v) in zip(self.cache.layers, layers, strict=True):
                layer.keys, layer.values = k, v
        for row in joining:
            row.cache = None
        self.rows += joining

    def _compact(self, staying: list[int]) -> None:
        import torch

        self.rows = [self.rows[i] for i in staying]
        if not self.rows:
            self.cache = None
            return
        index = torch.tensor(staying, device=self.cache.layers[0].keys.device)
        width = max(r.length for r in self.rows)  # the left padding no row needs any more goes too
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, -width:]
            layer.values = layer.values.index_select(0, index)[:, :, -width:]

    def mask(self, extra: int):
        """The attention mask of the batch's rows over the cache and `extra` new positions."""
        import torch

        device = self.cache.layers[0].keys.device
        lengths = torch.tensor([r.length for r in self.rows], device=device)
        columns = torch.arange(self.width + extra, device=device)
        return (columns[None] >= (self.width - lengths)[:, None]).long()


def _left_pad(tensor, count: int):
    import torch

    return tensor if count == 0 else torch.nn.functional.pad(tensor, (0, 0, count, 0))
