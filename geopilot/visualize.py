"""Draw tool outputs on the image (`geopilot chat --out out.png`): boxes and polygons with labels,
masks as translucent overlays (COCO RLE decoded with pycocotools), road graphs as lines and nodes.

    draw_outputs(image, [call.output for call in result.tool_calls if call.output]).save("out.png")
    draw_chain(image, result.tool_calls).save("chain.png")  # input -> each call's result, side by side
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


def chain_panels(image: Image.Image, calls) -> list[tuple[str, Image.Image]]:
    """[(caption, picture)]: the input, then each call's result in call order. An image artefact is shown as it is
    (and is what a later `result:N` call is drawn on); other outputs are drawn on the image they were computed on."""
    images = {"input": image.convert("RGB")}
    panels = [("input", images["input"])]
    for number, call in enumerate(calls, start=1):
        caption = f"{number}. {call.tool}"
        if call.output is None:  # a failed call: the model read its error, nothing was computed
            panels.append((caption + " (failed)", Image.new("RGB", image.size, (235, 235, 235))))
            continue
        base = images.get(call.output.computed_on, images["input"])
        artefact = next((a for a in call.output.artifacts if a.kind == "image"), None)
        if artefact is not None:
            from geopilot.image import load_image

            picture = load_image(artefact.path).image.convert("RGB")
            images[f"result:{number}"] = picture
        else:
            picture = draw_outputs(base, [call.output])
        on = "" if call.output.computed_on == "input" else f" on {call.output.computed_on}"
        panels.append((caption + on, picture))
    return panels


def draw_chain(image: Image.Image, calls, height: int = 256) -> Image.Image:
    """The panels of `chain_panels` side by side at one height, each captioned below, joined by arrows."""
    panels = chain_panels(image, calls)
    gap, caption = 28, 18
    scaled = [p.resize((max(1, round(p.width * height / p.height)), height)) for _, p in panels]
    width = sum(p.width for p in scaled) + gap * (len(scaled) - 1)
    strip = Image.new("RGB", (width, height + caption), "white")
    pen = ImageDraw.Draw(strip)
    x = 0
    for index, ((text, _), picture) in enumerate(zip(panels, scaled, strict=True)):
        strip.paste(picture, (x, 0))
        pen.text((x + 2, height + 3), text, fill=(40, 40, 40))
        x += picture.width
        if index < len(scaled) - 1:
            middle = height // 2
            pen.line([(x + 5, middle), (x + gap - 6, middle)], fill=(90, 90, 90), width=2)
            pen.polygon(
                [(x + gap - 6, middle - 5), (x + gap - 6, middle + 5), (x + gap - 1, middle)], fill=(90, 90, 90)
            )
            x += gap
    return strip
