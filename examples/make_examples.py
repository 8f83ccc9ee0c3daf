"""Write examples/images/: ten synthetic scenes (8 optical, 2 SAR) with their annotations, one per one-image
task-level tool, and a before/after pair with its change label (detect_changes).

    python examples/make_examples.py            # rewrites examples/images/ (deterministic: the same bytes each run)
    python examples/make_examples.py --figure docs/images/worked_examples.png   # + each reference call drawn

The scenes come from `geopilot synth`'s generator (geopilot.data_gen.synthetic.scenes); each is the first seed whose
scene holds what its question needs. examples/images/README.md describes the files and their format.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from geopilot.data_gen.synthetic.change import change_pair
from geopilot.data_gen.synthetic.scenes import SIZE, optical_scene, sar_scene
from geopilot.vocabulary import canonical_class

OUT = Path(__file__).resolve().parent / "images"
LAND_COVER = {1: "bareland", 2: "rangeland", 3: "developed space", 4: "road", 5: "tree", 6: "water"}
LAND_COVER |= {7: "agriculture land", 8: "building"}  # OpenEarthMap's codes, as synth paints them
CHANGE_SEED = 46  # the before/after pair (geopilot synth's bi-temporal generator); its label is LEVIR-CD's 0/255

# (file stem, modality, the reference call's tool and params, question, what the scene must hold, what the answer
# must say: format strings over the scene's facts)
EXAMPLES = [
    (
        "airport",
        "optical",
        "detect_objects",
        {"categories": ["airplane"]},
        "How many planes are there in this image?",
        "plane",
        "{count}",
    ),
    (
        "harbour",
        "optical",
        "segment_instances",
        {"categories": ["ship"]},
        "Segment every ship in this image.",
        "ship",
        "{count}",
    ),
    ("parking", "optical", "detect_all", {}, "Detect all objects in this image.", "small-vehicle", "{objects}"),
    ("landmark", "optical", "ground", {"expression": "{expression}"}, "Where is {expression}?", "referring", ""),
    (
        "outline",
        "optical",
        "segment_referring",
        {"expression": "{expression}"},
        "Segment {expression}.",
        "referring",
        "",
    ),
    ("town", "optical", "segment_semantic", {"classes": ["water"]}, "How much of this image is water?", "water", ""),
    ("roads", "optical", "extract_roads", {}, "Extract the road network in this image.", "roads", ""),
    ("cloudy", "optical", "remove_clouds", {}, "Remove the clouds from this image.", "clouds", ""),
    ("sar_ship", "sar", "sar_detect_all", {}, "Detect all targets in this SAR image.", "ship", "{objects}"),
    ("sar_port", "sar", "sar_ground", {"expression": "{expression}"}, "Where is {expression}?", "one ship", ""),
]


def _holds(scene, need: str, modality: str) -> bool:
    labels = [obj.label for obj in scene.objects]
    if modality == "sar":
        return labels.count("ship") == 1 if need == "one ship" else need in labels
    if need == "referring":
        return scene.referring is not None
    if need == "water":
        return 0.1 < float((scene.landcover == 6).mean()) < 0.6
    return need in labels if need not in ("roads", "clouds") else bool(scene.roads)


def _scene(modality: str, need: str, used: set[int]):
    for seed in range(1, 500):
        if seed in used:
            continue
        rng = np.random.default_rng(seed)
        scene = optical_scene(rng) if modality == "optical" else sar_scene(rng, sixteen_bit=False)
        if _holds(scene, need, modality):
            used.add(seed)
            return scene
    raise RuntimeError(f"no seed below 500 gives a {modality} scene with {need}")


def _sar_png(amplitude: np.ndarray) -> np.ndarray:
    return (np.clip(amplitude / np.percentile(amplitude, 99.5), 0, 1) * 255).astype(np.uint8)


def _flat(points) -> list[float]:
    return [round(float(v), 1) for point in points for v in point]


def _roads_geojson(roads) -> dict:
    lines = [
        {"type": "Feature", "properties": {}, "geometry": {"type": "LineString", "coordinates": road}} for road in roads
    ]
    return {"type": "FeatureCollection", "features": lines}


def _change_example(image_id: int) -> dict:
    """changes_before.png, changes_after.png and change/changes.png: the images entry of the pair."""
    pair = change_pair(np.random.default_rng(CHANGE_SEED))
    (OUT / "change").mkdir(exist_ok=True)
    Image.fromarray(pair.before).save(OUT / "changes_before.png")
    Image.fromarray(pair.after).save(OUT / "changes_after.png")
    Image.fromarray(pair.label).save(OUT / "change" / "changes.png")
    entry = {"id": image_id, "file_name": "changes_before.png", "width": SIZE, "height": SIZE, "modality": "optical"}
    return entry | {"after_image": "changes_after.png", "change_mask": "change/changes.png"}


def main() -> None:
    OUT.mkdir(exist_ok=True)
    (OUT / "land_cover").mkdir(exist_ok=True)
    (OUT / "roads").mkdir(exist_ok=True)
    categories: dict[str, int] = {}
    images, annotations, refs, questions, used = [], [], [], [], set()
    for image_id, (stem, modality, tool, params, question, need, answer) in enumerate(EXAMPLES, start=1):
        scene = _scene(modality, need, used)
        entry = {"id": image_id, "file_name": f"{stem}.png", "width": SIZE, "height": SIZE, "modality": modality}
        if modality == "optical":
            picture = scene.cloudy if need == "clouds" else scene.image
            Image.fromarray(scene.landcover).save(OUT / "land_cover" / f"{stem}.png")
            roads = [[[round(x, 1), round(y, 1)] for x, y in road] for road in scene.roads]
            (OUT / "roads" / f"{stem}.geojson").write_text(json.dumps(_roads_geojson(roads)) + "\n")
            entry |= {"land_cover": f"land_cover/{stem}.png", "roads": f"roads/{stem}.geojson"}
            if need == "clouds":
                Image.fromarray(scene.image).save(OUT / f"{stem}_clear.png")
                entry["cloud_free"] = f"{stem}_clear.png"
        else:
            picture = _sar_png(scene.amplitude)
        Image.fromarray(picture).save(OUT / f"{stem}.png")
        images.append(entry)
        first_id = len(annotations) + 1
        for obj in scene.objects:
            name = canonical_class(obj.label)
            x1, y1, x2, y2 = obj.bounds
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": categories.setdefault(name, len(categories) + 1),
                    "bbox": [round(x1, 1), round(y1, 1), round(x2 - x1, 1), round(y2 - y1, 1)],
                    "segmentation": [_flat(obj.outline)],
                    "iscrowd": 0,
                }
            )
        expression = ""
        if modality == "optical" and scene.referring is not None:
            index, phrases = scene.referring
            expression = phrases[0]
            refs.append(
                {"image_id": image_id, "ann_ids": [first_id + index], "sentences": [{"sent": p} for p in phrases]}
            )
        elif need == "one ship":
            index = [obj.label for obj in scene.objects].index("ship")
            expression = "the ship"
            refs.append({"image_id": image_id, "ann_ids": [first_id + index], "sentences": [{"sent": expression}]})
        labels = [canonical_class(obj.label) for obj in scene.objects]
        facts = {"count": labels.count(canonical_class(need)), "objects": len(labels)}
        reference = {k: v.format(expression=expression) if isinstance(v, str) else v for k, v in params.items()}
        questions.append(
            {"image": f"{stem}.png", "question": question.format(expression=expression), "tool": tool}
            | {"params": reference}
            | ({"answer_contains": answer.format(**facts)} if answer else {})
        )
    images.append(_change_example(len(images) + 1))
    coco = {
        "info": {"description": "GeoPilot example images (synthetic scenes)", "version": "1.0"},
        "licenses": [{"id": 1, "name": "CC0-1.0", "url": "https://creativecommons.org/publicdomain/zero/1.0/"}],
        "land_cover_classes": {str(k): v for k, v in LAND_COVER.items()},
        "categories": [{"id": i, "name": name} for name, i in categories.items()],
    }
    lines = [json.dumps({k: v})[1:-1] + "," for k, v in coco.items()]
    for section, entries in (("images", images), ("annotations", annotations), ("refs", refs)):
        body = ",\n".join("  " + json.dumps(e) for e in entries)
        lines.append(f'"{section}": [\n{body}\n]' + ("," if section != "refs" else ""))
    (OUT / "annotations.json").write_text("{\n" + "\n".join(lines) + "\n}\n")
    (OUT / "questions.json").write_text("[\n" + ",\n".join("  " + json.dumps(q) for q in questions) + "\n]\n")


def reference_figure(path: Path) -> None:
    """Each example's reference call through the example tools, drawn as the demo's worked-examples figure is."""
    import tempfile

    from geopilot.demo.report import plot_worked_examples
    from geopilot.demo.settings import Layout
    from geopilot.image import load_image
    from geopilot.sample import Action
    from geopilot.tool_output import llm_view
    from geopilot.tools.registry import EXAMPLES_CONFIG, build_registry
    from geopilot.visualize import chain_panels

    registry = build_registry(
        EXAMPLES_CONFIG, [f"tools.{t[2]}.options.annotations={OUT / 'annotations.json'}" for t in EXAMPLES]
    )
    layout = Layout(tempfile.mkdtemp())
    layout.examples.mkdir()
    worked = []
    for example in json.loads((OUT / "questions.json").read_text()):
        image = load_image(OUT / example["image"])
        result = registry.call(Action(tool=example["tool"], params=example["params"]), image)
        chain_panels(image.image, [result])[-1][1].save(layout.examples / example["image"])
        call = {"tool": example["tool"], "params": example["params"], "error": result.error}
        summary = json.dumps(llm_view(result.output))
        worked.append(
            example
            | {"tool_calls": [call], "answer": summary, "picture": example["image"], "verdict": "the reference call"}
        )
    plot_worked_examples(layout, worked, path)


if __name__ == "__main__":
    import sys

    main()
    if sys.argv[1:2] == ["--figure"]:
        reference_figure(Path(sys.argv[2]))
