"""Road graphs: adjacency-dict pickles (Sat2Graph / SAM-Road) and GeoJSON LineStrings -> RoadGraphAnnotation."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from numbers import Real

from geopilot.records import RoadGraphAnnotation

Point = tuple[float, float]


def _key(value: object) -> Point:
    if not (isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, Real) for v in value)):
        raise ValueError(f"graph node {value!r} is not a 2-tuple of numbers")
    return float(value[0]), float(value[1])


class GraphBuilder:
    """Collects pixel-space nodes (merged by position) and undirected edges, then normalises."""

    def __init__(self) -> None:
        self.index: dict[Point, int] = {}
        self.edges: set[tuple[int, int]] = set()

    def node(self, xy: Point) -> int:
        key = (round(xy[0], 3), round(xy[1], 3))
        return self.index.setdefault(key, len(self.index))

    def edge(self, a: Point, b: Point) -> None:
        i, j = self.node(a), self.node(b)
        if i != j:
            self.edges.add((min(i, j), max(i, j)))

    def build(self, width: int, height: int) -> RoadGraphAnnotation:
        nodes = tuple((min(1.0, max(0.0, x / width)), min(1.0, max(0.0, y / height))) for x, y in self.index)
        return RoadGraphAnnotation(nodes, tuple(sorted(self.edges)))


def adjacency_graph(adjacency: object, to_xy: Callable[[Point], Point], width: int, height: int) -> RoadGraphAnnotation:
    """`{node: [neighbour, ...]}` (node = 2-tuple in the pickle's own order) -> graph; ValueError if malformed."""
    if not isinstance(adjacency, dict):
        raise ValueError(f"graph pickle holds a {type(adjacency).__name__}, expected a dict")
    builder = GraphBuilder()
    for node, neighbours in adjacency.items():
        start = to_xy(_key(node))
        builder.node(start)
        if not isinstance(neighbours, (list, tuple, set, frozenset)):
            raise ValueError(f"neighbours of {node!r} are a {type(neighbours).__name__}, expected a list")
        for neighbour in neighbours:
            builder.edge(start, to_xy(_key(neighbour)))
    return builder.build(width, height)


def polyline_graph(lines: Iterable[list[Point]], width: int, height: int) -> RoadGraphAnnotation:
    """Pixel polylines -> graph; vertices shared by lines (intersections) become one node."""
    builder = GraphBuilder()
    for line in lines:
        for a, b in zip(line, line[1:], strict=False):
            builder.edge(a, b)
        if len(line) == 1:
            builder.node(line[0])
    return builder.build(width, height)
