"""Source-dataset readers: one module per dataset, each `read_<name>(root, split=...) -> (records, ReadReport)`.

`READERS` is the one table the generator looks readers up in (config `source:` names are its keys).
Records carry geometry normalised to [0, 1]; bad items are skipped and counted per cause in the ReadReport
(causes in `common.py`); a missing/unusable root raises `DatasetRootError` (a GeoPilotInputError).
"""

from __future__ import annotations

from collections.abc import Callable

from geopilot.data_gen.readers.cityscale import read_cityscale
from geopilot.data_gen.readers.common import DatasetRootError, ReadResult
from geopilot.data_gen.readers.dior import read_dior
from geopilot.data_gen.readers.dota import read_dota
from geopilot.data_gen.readers.fair1m import read_fair1m
from geopilot.data_gen.readers.geochat import read_geochat
from geopilot.data_gen.readers.isaid import read_isaid
from geopilot.data_gen.readers.openearthmap import read_openearthmap
from geopilot.data_gen.readers.rice import read_rice
from geopilot.data_gen.readers.risbench import read_risbench
from geopilot.data_gen.readers.sardet import read_sardet
from geopilot.data_gen.readers.sarlang import read_sarlang
from geopilot.data_gen.readers.spacenet import read_spacenet

READERS: dict[str, Callable[..., ReadResult]] = {
    "dota": read_dota,
    "dior": read_dior,
    "fair1m": read_fair1m,
    "risbench": read_risbench,
    "isaid": read_isaid,
    "openearthmap": read_openearthmap,
    "spacenet": read_spacenet,
    "cityscale": read_cityscale,
    "rice": read_rice,
    "geochat_instruct": read_geochat,
    "sarlang": read_sarlang,
    "sardet": read_sardet,
}

__all__ = ["READERS", "DatasetRootError", "ReadResult"]
