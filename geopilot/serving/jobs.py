"""What the HTTP API and the web demo share about a chat job: admitting it, its error as a refusal, its GeoJSON."""

import logging

from geopilot.errors import GeoPilotInputError
from geopilot.serving.batcher import Batcher, Busy, Slot
from geopilot.serving.security import ServeError

log = logging.getLogger("geopilot.serving")


def admit(batcher: Batcher) -> Slot:
    try:
        return batcher.admit()
    except Busy as err:
        raise ServeError(503, f"server busy: {err}", "server_error", code="busy") from None


def job_error(err: BaseException) -> ServeError:
    if isinstance(err, ServeError):
        return err
    if isinstance(err, GeoPilotInputError):
        return ServeError(400, str(err), code="bad_request")
    log.error("chat failed", exc_info=err)
    return ServeError(500, f"internal error ({type(err).__name__}); the server keeps serving", "server_error")


def geojson_of(result) -> dict | None:
    """A georeferenced image's results: every call's features as one RFC 7946 FeatureCollection (WGS 84)."""
    features = [f for c in result.tool_calls if c.output and c.output.geojson for f in c.output.geojson["features"]]
    return {"type": "FeatureCollection", "features": features} if features else None
