"""A restricted unpickler for road-graph pickles: builtin containers and numbers only, nothing that runs code.

Plain pickles of dicts/lists/tuples/ints/floats/strs need no globals at all; the few globals allowed are
`set`/`frozenset`, numpy's numeric scalar reconstruction (graphs built with numpy ints pickle that way),
which is turned straight into a Python number, and `_codecs.encode(str, "latin1")`, protocol 2's way to spell bytes. Anything else raises `UnsafePickleError` naming the global.
Python-2 pickles (Sat2Graph, CityScale) are read with `encoding="latin1"`.
"""

from __future__ import annotations

import builtins
import io
import pickle
from pathlib import Path

import numpy as np

from geopilot.data_gen.readers.common import read_limited
from geopilot.errors import GeoPilotInputError

_BUILTINS = {"set", "frozenset"}
_NUMPY_SCALAR = {("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")}
_NUMPY_DTYPE = {("numpy", "dtype")}


class UnsafePickleError(GeoPilotInputError):
    """A pickle that asks for a global beyond builtin containers and numbers."""


def _numeric_scalar(dtype: np.dtype, data=None):
    if not isinstance(dtype, np.dtype) or dtype.kind not in "biuf":
        raise UnsafePickleError(f"pickle builds a numpy scalar of dtype {dtype!r}; only numeric ones are allowed")
    if isinstance(data, str):
        data = data.encode("latin1")  # Python-2 bytes read with encoding="latin1"
    return np.frombuffer(data, dtype=dtype, count=1)[0].item()


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    """What protocol-2 pickles call (`_codecs.encode`) to spell bytes, such as numpy scalar data."""
    if not isinstance(text, str) or encoding.lower().replace("-", "") != "latin1":
        raise UnsafePickleError(f"pickle calls _codecs.encode with {encoding!r}; only latin1 is allowed")
    return text.encode("latin1")


class RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module == "builtins" and name in _BUILTINS:  # "__builtin__" is mapped to "builtins" by fix_imports
            return getattr(builtins, name)
        if (module, name) in _NUMPY_SCALAR:
            return _numeric_scalar
        if (module, name) in _NUMPY_DTYPE:
            return np.dtype
        if (module, name) == ("_codecs", "encode"):
            return _latin1_bytes
        raise UnsafePickleError(
            f"pickle asks for {module}.{name}; only builtin containers and numbers are allowed (refused, not loaded)"
        )

    def persistent_load(self, pid):
        raise UnsafePickleError("pickle uses persistent ids; refused")


def safe_load(path: Path) -> object:
    """Load a pickle with RestrictedUnpickler. Raises UnsafePickleError, or pickle/EOF/Value errors if corrupt."""
    data = read_limited(Path(path), what="graph pickle")
    return RestrictedUnpickler(io.BytesIO(data), encoding="latin1").load()
