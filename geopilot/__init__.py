"""GeoPilot: a tool-augmented remote-sensing assistant for optical and SAR imagery.

The public surface is small on purpose; heavy modules load on first use.
"""

from geopilot.errors import GeoPilotError, GeoPilotInputError

__version__ = "0.1.0"
__all__ = ["GeoPilot", "GeoPilotError", "GeoPilotInputError", "__version__"]


def __getattr__(name: str):
    # `from geopilot import GeoPilot` without importing torch/transformers at `import geopilot` time.
    if name == "GeoPilot":
        from geopilot.agent import GeoPilot

        return GeoPilot
    raise AttributeError(f"module 'geopilot' has no attribute {name!r}")
