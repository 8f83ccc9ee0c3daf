"""Draw tool outputs on the image (`geopilot chat --save-vis out.png`): boxes and polygons with labels,
masks as translucent overlays (COCO RLE decoded with pycocotools), road graphs as lines and nodes.

    draw_outputs(image, [call.output for call in result.tool_calls if call.output]).save("out.png")
"""

from __future__ import annotations

from PIL import Image, ImageDraw

from geopilot.tool_output import RLE, ToolOutput

PALETTE = [
    (230, 25, 75),
    (60, 180, 75),
    (255, 225, 25),
    (0, 130, 200),
    (245, 130, 48),
    (145, 30, 180),
    (70, 240, 240),
    (240, 50, 230),
    (210, 245, 60),
    (250, 190, 212),
]
ROAD_COLOUR = (255, 140, 0)
MASK_ALPHA = 110


def _colour(label: str, colours: dict[str, tuple[int, int, int]]) -> tuple[int, int, int]:
    return colours.setdefault(label, PALETTE[len(colours) % len(PALETTE)])


def _mask_image(rle: RLE, size: tuple[int, int]) -> Image.Image | None:
    """RLE -> an 'L' mask resized to the image; None without pycocotools (masks are then skipped)."""
    try:
        from pycocotools import mask as mask_utils
    except ImportError:
        return None
    decoded = mask_utils.decode({"size": list(rle.size), "counts": rle.counts.encode()})
    mask = Image.fromarray((decoded * 255).astype("uint8"), "L")
    return mask if mask.size == size else mask.resize(size, Image.NEAREST)


def draw_outputs(image: Image.Image, outputs: list[ToolOutput]) -> Image.Image:
    """A copy of `image` (RGB) with every detection, segment mask and road graph of `outputs` drawn on it."""
    canvas = image.convert("RGBA")
    width, height = canvas.size
    colours: dict[str, tuple[int, int, int]] = {}
    overlay = Image.new("RGBA", canvas.size, (0, 0, 0, 0))
    for output in outputs:
        masks = [(d.label, d.mask) for d in output.detections if d.mask] + [
            (s.label, s.mask) for s in output.segments if s.mask
        ]
        for label, rle in masks:
            mask = _mask_image(rle, canvas.size)
            if mask is not None:
                fill = Image.new("RGBA", canvas.size, (*_colour(label, colours), MASK_ALPHA))
                overlay.paste(fill, (0, 0), mask)
    canvas = Image.alpha_composite(canvas, overlay)
    pen = ImageDraw.Draw(canvas)
    line = max(1, round(min(width, height) / 200))
    for output in outputs:
        for det in output.detections:
            colour = _colour(det.label, colours)
            if det.polygon:
                pen.polygon([(x * width, y * height) for x, y in det.polygon], outline=colour, width=line)
            x1, y1, x2, y2 = det.box
            box = (x1 * width, y1 * height, x2 * width, y2 * height)
            if not det.polygon:
                pen.rectangle(box, outline=colour, width=line)
            caption = det.label + (f" {det.score:.2f}" if det.score is not None else "")
            pen.text((box[0] + line, max(0, box[1] - 11)), caption, fill=colour)
        if output.roads is not None:
            nodes = [(x * width, y * height) for x, y in output.roads.nodes]
            for a, b in output.roads.edges:
                pen.line([nodes[a], nodes[b]], fill=ROAD_COLOUR, width=line + 1)
            for x, y in nodes:
                pen.ellipse((x - line - 1, y - line - 1, x + line + 1, y + line + 1), fill=ROAD_COLOUR)
    return canvas.convert("RGB")
