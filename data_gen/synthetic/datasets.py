"""Write small synthetic optical and SAR scenes with annotations in the source datasets' real on-disk formats.

Run: `geopilot synth --out DIR [--seed N] [--optical N --sar N]`, or `write_synthetic(Path(DIR), seed=0)`.
Under DIR (each folder is a dataset root the matching reader in `geopilot.data_gen.readers` reads back):
  DOTA/train/{images,labelTxt}/            oriented boxes, DOTA v1.0 classes, some files with imagesource/gsd headers
  RiSBench/{img_rgb,mask}/ + output_phrase_train.txt   one uniquely described object per scene, two phrases
  OpenEarthMap/synth_town/{images,labels}/ + train.txt  GeoTIFF image + single-band land-cover codes 1..8
  SpaceNet/AOI_0_Synth/{PS-RGB,geojson_roads}/          GeoTIFF (EPSG:4326) + lon/lat/z LineStrings
  CityScale/20cities/region_<i>_{sat.png,gt_graph.p}   (row, col) adjacency-dict pickles, protocol 2
  RICE/RICE1/{cloud,label}/<n>.png                      cloudy / clear pairs
  iSAID/train/{images,Annotations/iSAID_train.json}     COCO pixel polygons, iSAID's mixed-case class names
  GeoChat-Instruct/{GeoChat_Instruct.json,images/}      LLaVA conversations: counting VQA, scene questions, [refer]
  SARDet-100K/Annotations/train.json + JPEGImages/train/   speckled single-channel PNG, every other one 16-bit
  SARLANG-1M/SARimages/ + Text/caption/Caption-training.csv + Text/VQA/SARVQA1_train.csv
  LEVIR-CD/train/{A,B,label}/                           bi-temporal pairs, buildings built / demolished, 0/255 labels
  LEVIR-CC/LevirCCcaptions.json + images/train/{A,B}/   the same pairs with five change captions each
  synth_manifest.json                                   what was placed, per dataset and record
Deterministic per seed: the same seed writes byte-identical files.
"""

from __future__ import annotations

import csv
import io
import json
import math
import pickle
import random
from collections import Counter
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from geopilot.data_gen.readers.common import class_label
from geopilot.data_gen.synthetic.change import change_pairs, write_levir_cc, write_levir_cd
from geopilot.data_gen.synthetic.scenes import SIZE, OpticalScene, SarScene, optical_scene, png_bytes, sar_scene
from geopilot.errors import GeoPilotInputError
from geopilot.sample import IMAGE_PLACEHOLDER

SAR_CLASSES = ("ship", "aircraft", "car", "tank", "bridge", "harbor")
SAR_CATEGORY_IDS = {name: 10 + 3 * i for i, name in enumerate(reversed(SAR_CLASSES))}  # not 1..6: match by name
LON0, LAT0, DEGREES_PER_PIXEL = -115.30, 36.20, 3e-6  # a Vegas-like origin, ~0.3 m pixels
CITYSCALE_INDICES = [i for i in range(1000) if i % 10 < 8]  # region indices of CityScale's train split


def _png(image: np.ndarray | bytes, path: Path) -> None:
    """Write an array, or PNG bytes already encoded (`OpticalScene.image_png`), as a PNG file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(image if isinstance(image, bytes) else png_bytes(image))


def _text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def write_geotiff(path: Path, bands: np.ndarray, transform=None) -> None:
    """(H, W, C) or (H, W) uint8 -> GeoTIFF (EPSG:4326 when a transform is given)."""
    import rasterio

    path.parent.mkdir(parents=True, exist_ok=True)
    data = bands[None] if bands.ndim == 2 else np.moveaxis(bands, 2, 0)
    georef = {"crs": "EPSG:4326", "transform": transform} if transform is not None else {}
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        width=data.shape[2],
        height=data.shape[1],
        count=data.shape[0],
        dtype=data.dtype.name,
        **georef,
    ) as dataset:
        dataset.write(data)


def _lonlat_transform():
    from affine import Affine

    return Affine(DEGREES_PER_PIXEL, 0.0, LON0, 0.0, -DEGREES_PER_PIXEL, LAT0)  # north-up, origin top-left


def _object_counts(labels, dataset: str) -> dict[str, int]:
    """What the reader will say: each source class name as its canonical class (geopilot.vocabulary)."""
    return dict(sorted(Counter(class_label(label, dataset) for label in labels).items()))


def _graph_counts(roads: list[list[tuple[float, float]]]) -> dict[str, int]:
    nodes = {point for road in roads for point in road}
    edges = {frozenset(pair) for road in roads for pair in zip(road, road[1:], strict=False)}
    return {"nodes": len(nodes), "edges": len(edges)}


def write_dota(root: Path, scenes: list[OpticalScene]) -> dict:
    records = {}
    for i, scene in enumerate(scenes):
        stem = f"P{i:04d}"
        _png(scene.image_png, root / "train" / "images" / f"{stem}.png")
        header = "imagesource:GoogleEarth\ngsd:0.3\n" if i % 2 == 0 else ""  # odd files look like devkit patches
        fmt = "{:.0f}" if i % 3 == 0 else "{:.1f}"  # v1.0 writes ints, later releases floats
        lines = [
            " ".join(fmt.format(v) for corner in obj.corners for v in corner) + f" {obj.label} {int(obj.difficult)}"
            for obj in scene.objects
        ]
        _text(root / "train" / "labelTxt" / f"{stem}.txt", header + "".join(line + "\n" for line in lines))
        records[stem] = {"objects": _object_counts((o.label for o in scene.objects), "DOTA v1.0")}
    return {"reader": "dota", "root": "DOTA", "split": "train", "records": records}


def write_risbench(root: Path, scenes: list[OpticalScene]) -> dict:
    records, lines = {}, []
    for i, scene in enumerate(scenes):
        if scene.referring is None:
            continue
        index, phrases = scene.referring
        name = f"train_{i}.png"
        _png(scene.image_png, root / "img_rgb" / name)
        mask = Image.new("L", (SIZE, SIZE), 0)
        ImageDraw.Draw(mask).polygon(scene.objects[index].outline, fill=255)
        (root / "mask").mkdir(parents=True, exist_ok=True)
        mask.save(root / "mask" / name, format="PNG", compress_level=1)
        lines += [f"{name} {phrase}" for phrase in phrases]
        xs, ys = zip(*scene.objects[index].outline, strict=True)  # the mask covers the drawn footprint
        x1, y1, x2, y2 = min(xs), min(ys), max(xs), max(ys)
        records[f"train_{i}"] = {"phrases": phrases, "box": [x1 / SIZE, y1 / SIZE, x2 / SIZE, y2 / SIZE]}
    _text(root / "output_phrase_train.txt", "".join(line + "\n" for line in lines))
    return {"reader": "risbench", "root": "RiSBench", "split": "train", "records": records}


def write_openearthmap(root: Path, scenes: list[OpticalScene]) -> dict:
    region = "synth_town"  # an underscore in the region name, as in real OpenEarthMap regions
    transform = _lonlat_transform()
    records, names = {}, []
    for i, scene in enumerate(scenes):
        name = f"{region}_{i + 1}.tif"
        write_geotiff(root / region / "images" / name, scene.image, transform)
        write_geotiff(root / region / "labels" / name, scene.landcover, transform)
        names.append(name)
        records[name[:-4]] = {"codes": sorted(int(c) for c in np.unique(scene.landcover))}
    _text(root / "train.txt", "".join(n + "\n" for n in names))
    return {"reader": "openearthmap", "root": "OpenEarthMap", "split": "train", "records": records}


def write_spacenet(root: Path, scenes: list[OpticalScene]) -> dict:
    transform = _lonlat_transform()
    aoi = root / "AOI_0_Synth"
    records = {}
    for i, scene in enumerate(scenes):
        image_stem = f"SN3_roads_train_AOI_0_Synth_PS-RGB_img{i + 1}"
        write_geotiff(aoi / "PS-RGB" / f"{image_stem}.tif", scene.image, transform)
        features = []
        for road in scene.roads:
            coords = [[*(transform @ point), 0.0] for point in road]  # SpaceNet stores a z value
            features.append(
                {
                    "type": "Feature",
                    "properties": {"road_type": "5"},
                    "geometry": {"type": "LineString", "coordinates": coords},
                }
            )
        geojson = {
            "type": "FeatureCollection",
            "crs": {"type": "name", "properties": {"name": "urn:ogc:def:crs:OGC:1.3:CRS84"}},
            "features": features,
        }
        name = f"SN3_roads_train_AOI_0_Synth_geojson_roads_img{i + 1}.geojson"
        _text(aoi / "geojson_roads" / name, json.dumps(geojson, indent=1))
        records[image_stem] = _graph_counts(scene.roads)
    return {"reader": "spacenet", "root": "SpaceNet", "split": "train", "records": records}


def write_cityscale(root: Path, scenes: list[OpticalScene]) -> dict:
    folder = root / "20cities"
    records = {}
    for i, scene in enumerate(scenes):
        region = CITYSCALE_INDICES[i]
        _png(scene.image_png, folder / f"region_{region}_sat.png")
        adjacency: dict[tuple[int, int], list[tuple[int, int]]] = {}
        rounded = [[(round(y), round(x)) for x, y in road] for road in scene.roads]  # (row, col) keys
        for road in rounded:
            for a, b in zip(road, road[1:], strict=False):
                adjacency.setdefault(a, []).append(b)
                adjacency.setdefault(b, []).append(a)
        (folder / f"region_{region}_gt_graph.p").write_bytes(pickle.dumps(adjacency, protocol=2))
        records[f"region_{region}"] = _graph_counts([[(c, r) for r, c in road] for road in rounded])
    return {"reader": "cityscale", "root": "CityScale", "split": "train", "records": records}


def write_rice(root: Path, scenes: list[OpticalScene]) -> dict:
    records = {}
    for i, scene in enumerate(scenes):
        _png(scene.cloudy, root / "RICE1" / "cloud" / f"{i}.png")
        _png(scene.image_png, root / "RICE1" / "label" / f"{i}.png")
        records[f"RICE1/{i}"] = {}
    return {"reader": "rice", "root": "RICE", "split": "all", "records": records}


ISAID_NAMES = {  # DOTA class -> iSAID's mixed-case category name
    "plane": "plane",
    "ship": "ship",
    "small-vehicle": "Small_Vehicle",
    "large-vehicle": "Large_Vehicle",
    "storage-tank": "storage_tank",
    "tennis-court": "tennis_court",
    "swimming-pool": "Swimming_pool",
    "helicopter": "Helicopter",
    "bridge": "Bridge",
    "harbor": "Harbor",
    "roundabout": "Roundabout",
    "baseball-diamond": "baseball_diamond",
    "basketball-court": "basketball_court",
    "ground-track-field": "Ground_Track_Field",
    "soccer-ball-field": "Soccer_ball_field",
}
ISAID_ORDER = (
    "ship",
    "storage_tank",
    "baseball_diamond",
    "tennis_court",
    "basketball_court",
    "Ground_Track_Field",
    "Bridge",
    "Large_Vehicle",
    "Small_Vehicle",
    "Helicopter",
    "Swimming_pool",
    "Roundabout",
    "Soccer_ball_field",
    "plane",
    "Harbor",
)


def write_isaid(root: Path, scenes: list[OpticalScene]) -> dict:
    category_ids = {name: i + 1 for i, name in enumerate(ISAID_ORDER)}  # the devkit's ids 1..15
    images, annotations, records = [], [], {}
    for i, scene in enumerate(scenes):
        name = f"P{i:04d}.png"
        _png(scene.image_png, root / "train" / "images" / name)
        images.append({"id": i, "file_name": name, "width": SIZE, "height": SIZE})
        for obj in scene.objects:
            xs, ys = zip(*obj.outline, strict=True)
            x1, y1, x2, y2 = min(xs), min(ys), max(xs), max(ys)
            annotations.append(
                {
                    "id": len(annotations),
                    "image_id": i,
                    "category_id": category_ids[ISAID_NAMES[obj.label]],
                    "segmentation": [[round(v, 1) for point in obj.outline for v in point]],
                    "bbox": [round(x1, 1), round(y1, 1), round(x2 - x1, 1), round(y2 - y1, 1)],
                    "area": round((x2 - x1) * (y2 - y1), 1),
                    "iscrowd": 0,
                }
            )
        records[name[:-4]] = {"objects": _object_counts((ISAID_NAMES[o.label] for o in scene.objects), "iSAID")}
    categories = [{"id": category_ids[n], "name": n} for n in ISAID_ORDER]
    coco = {"images": images, "annotations": annotations, "categories": categories}
    _text(root / "train" / "Annotations" / "iSAID_train.json", json.dumps(coco))
    return {"reader": "isaid", "root": "iSAID", "split": "train", "records": records}


def _grid_box(bounds: tuple[float, float, float, float]) -> str:
    """Pixel bounds -> GeoChat's `{<x1><y1><x2><y2>|<0>}` on the 0-100 grid, rounded outwards (holds the object)."""
    left, top, right, bottom = (100 * v / SIZE for v in bounds)
    x1, y1 = max(0, math.floor(left)), max(0, math.floor(top))
    x2, y2 = min(100, math.ceil(right)), min(100, math.ceil(bottom))
    return f"{{<{x1}><{y1}><{x2}><{y2}>|<0>}}"


LANDCOVER_NAMES = {
    1: "bare land",
    2: "rangeland",
    3: "developed space",
    4: "road",
    5: "trees",
    6: "water",
    7: "agricultural land",
    8: "buildings",
}
DESCRIBE = [
    "Describe the image in detail.",
    "Give a detailed description of this aerial image.",
    "Write a short caption for this image.",
    "What is shown in this satellite image?",
    "Can you tell me what this overhead picture contains?",
    "Describe what you see in this image.",
    "Give me a brief overview of this area.",
    "What does this image show?",
    "Caption this aerial photo.",
    "Tell me about this scene in a few words.",
    "Write one line describing this overhead image.",
    "What is going on in this picture?",
    "Sum up this scene for me.",
]
DOMINANT = [
    "Which land-cover type takes up the most space in this image? Answer in one word or a short phrase.",
    "What covers most of the ground here?",
    "Which surface dominates this scene?",
    "What is the prevailing land cover here?",
    "Which kind of ground cover is most common in this image?",
    "What surface type covers the largest part of this picture?",
    "What does most of this area consist of?",
    "Which land-use class prevails in this tile?",
]
PRESENCE = [
    "Is there any {name} visible in the image? Answer yes or no.",
    "Can you see {name} in this picture?",
    "Does this scene contain {name}?",
    "Is any {name} visible here?",
    "Do you see {name} in this image?",
    "Is there {name} anywhere in this scene?",
]
SETTLEMENT = [
    "Would you describe this place as built-up or as countryside?",
    "Is this a densely built area?",
    "Does this look like a town or like open land?",
    "Is this place a town or countryside?",
    "Would you call this an urban area?",
    "Does this area look rural to you?",
    "Is this a built-up or a rural landscape?",
    "City or countryside: which is this?",
]
USE = [
    "What could this land be used for?",
    "What activities probably happen in this area?",
    "Judging by its look, what is this place for?",
    "What is this area probably used for?",
    "What purpose does this land seem to serve?",
    "What is the likely function of this place?",
    "How do people probably use this area?",
]
SENSOR = [
    "What kind of imagery is this?",
    "Was this picture taken by a radar or by a camera?",
    "Which type of sensor produced this image?",
    "Is this an optical photo or a radar image?",
    "What sort of sensor took this picture?",
    "What kind of image is this: optical or SAR?",
    "Which imaging technology produced this scene?",
]
TERRAIN = [
    "What type of landscape is this?",
    "How would you characterise the terrain here?",
    "What landscape does this image show?",
    "Is the land here mostly farmland, forest, water or town?",
]
IMPRESSION = [
    "Without using any tools, what is your impression of this scene?",
    "Just by looking, what would you say this area is like?",
    "Don't run any analysis; just tell me your overall view of this place.",
    "At a glance, what kind of place is this?",
]
USES = {
    1: "little, it is bare",
    2: "grazing",
    3: "parking and storage",
    4: "transport",
    5: "forestry",
    6: "fishing",
    7: "farming",
    8: "housing",
}


def _scene_questions(scene: OpticalScene, i: int) -> list[tuple[str, str, str]]:
    """GeoChat-Instruct-style tool-free questions answered from what the scene holds: a description, the dominant
    land cover, the presence of one land-cover type, built-up or open, likely use, sensor, terrain, an overall
    impression; each worded at random from a pool and, like the tool requests, often wrapped in a greeting and a
    sign-off (so a greeting never signals a tool call). (question, answer, task)."""
    from geopilot.data_gen.readers.geochat import task_of
    from geopilot.data_gen.wording import wrap

    rng = random.Random(i)
    shares = np.bincount(scene.landcover.ravel(), minlength=9)[1:9] / scene.landcover.size
    order = [int(c) + 1 for c in np.argsort(-shares, kind="stable")]
    counts = Counter(o.label.replace("-", " ") for o in scene.objects)
    things = ", ".join(f"{n} {label if n == 1 else label + 's'}" for label, n in sorted(counts.items()))
    mostly = f"mostly {LANDCOVER_NAMES[order[0]]} and {LANDCOVER_NAMES[order[1]]}"
    described = (
        f"An overhead view of a mixed area, {mostly}, crossed by {len(scene.roads)} roads, "
        f"with {things or 'no vehicles or structures'}."
    )
    code = (1, 2, 3, 5, 6, 7, 8)[i % 7]
    present = "Yes" if shares[code - 1] > 0.01 else "No"
    built = shares[2] + shares[3] + shares[7]  # developed space, road, buildings
    settlement = (
        "Built-up: roads and buildings cover much of it." if built > 0.3 else "Mostly open land with a few buildings."
    )
    asked = [
        (rng.choice(DESCRIBE), described),
        (rng.choice(DOMINANT), LANDCOVER_NAMES[order[0]].capitalize()),
        (rng.choice(PRESENCE).format(name=LANDCOVER_NAMES[code]), present),
        (rng.choice(SETTLEMENT), settlement),
        (rng.choice(USE), f"Mainly {USES[order[0]]} and {USES[order[1]]}."),
        (rng.choice(SENSOR), "An optical image in natural colour, taken from above."),
        (rng.choice(TERRAIN), f"A mixed landscape, {mostly}."),
        (rng.choice(IMPRESSION), f"A {'built-up' if built > 0.3 else 'mostly open'} area, {mostly}."),
        (rng.choice(DESCRIBE), described),
    ]
    return [(wrap(question, rng), answer, task_of(question)) for question, answer in asked]


def write_geochat(root: Path, scenes: list[OpticalScene]) -> dict:
    entries, records = [], {}
    for i, scene in enumerate(scenes):
        name = f"synth_{i}.png"
        _png(scene.image_png, root / "images" / name)
        counts = Counter(o.label.replace("-", " ") for o in scene.objects)
        label, count = sorted(counts.items())[0]
        question = (
            f"{IMAGE_PLACEHOLDER}\nHow many {label}s are there in the image? Answer in one word or a short phrase."
        )
        entries.append(
            {
                "id": f"synth_{i}",
                "image": name,
                "conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": str(count)}],
            }
        )
        records[f"synth_{i}"] = {"task": "vqa", "objects": 0, "answer": str(count)}
        for k, (question, answer, task) in enumerate(_scene_questions(scene, i)):
            entries.append(
                {
                    "id": f"synth_{i}_chat{k}",
                    "image": name,
                    "conversations": [
                        {"from": "human", "value": f"{IMAGE_PLACEHOLDER}\n{question}"},
                        {"from": "gpt", "value": answer},
                    ],
                }
            )
            records[f"synth_{i}_chat{k}"] = {"task": task, "objects": 0, "answer": answer}
        if scene.referring is not None:
            index, phrases = scene.referring
            refer = f"{IMAGE_PLACEHOLDER}\n[refer] give me the location of <p>{phrases[0]}</p>"
            box = _grid_box(scene.objects[index].bounds)
            entries.append(
                {
                    "id": f"synth_{i}_refer",
                    "image": name,
                    "conversations": [{"from": "human", "value": refer}, {"from": "gpt", "value": box}],
                }
            )
            x1, y1, x2, y2 = scene.objects[index].bounds
            records[f"synth_{i}_refer"] = {
                "task": "refer",
                "objects": 1,
                "box": [x1 / SIZE, y1 / SIZE, x2 / SIZE, y2 / SIZE],
            }
    _text(root / "GeoChat_Instruct.json", json.dumps(entries, indent=1))
    return {"reader": "geochat_instruct", "root": "GeoChat-Instruct", "split": "train", "records": records}


def _sar_pixels(scene: SarScene) -> np.ndarray:
    if scene.sixteen_bit:
        return np.clip(scene.amplitude * 40000.0, 0, 65535).astype(np.uint16)
    return np.clip(scene.amplitude * 255.0, 0, 255).astype(np.uint8)


def write_sardet(root: Path, scenes: list[SarScene]) -> dict:
    images, annotations, records = [], [], {}
    for i, scene in enumerate(scenes):
        name = f"{i:07d}.png"
        _png(_sar_pixels(scene), root / "JPEGImages" / "train" / name)  # the third-party JPEGImages/<split>/ layout
        images.append({"id": i + 1, "file_name": name, "width": SIZE, "height": SIZE})
        for obj in scene.objects:
            x1, y1, x2, y2 = obj.bounds
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": i + 1,
                    "category_id": SAR_CATEGORY_IDS[obj.label],
                    "bbox": [round(x1, 2), round(y1, 2), round(x2 - x1, 2), round(y2 - y1, 2)],
                    "area": round((x2 - x1) * (y2 - y1), 2),
                    "iscrowd": 0,
                    "segmentation": [],
                }
            )
        records[name[:-4]] = {"objects": _object_counts((o.label for o in scene.objects), "SARDet-100K")}
    categories = [{"id": SAR_CATEGORY_IDS[n], "name": n} for n in SAR_CLASSES]
    coco = {"images": images, "annotations": annotations, "categories": categories}
    _text(root / "Annotations" / "train.json", json.dumps(coco))
    return {"reader": "sardet", "root": "SARDet-100K", "split": "train", "records": records}


def _csv(path: Path, header: list[str], rows: list[list[str]]) -> None:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows([header, *rows])
    _text(path, buffer.getvalue())


def _plural(label: str) -> str:
    return label if label == "aircraft" else f"{label}s"


SAR_QUESTIONS = [  # (question, answer or None for the scene-dependent ones, SARLANG-style type)
    ("What kind of sensor captured this image?", "A synthetic aperture radar (SAR).", "sensor"),
    ("Is this a radar image or an optical photograph?", "A radar (SAR) image.", "sensor"),
    ("Does this scene include a coastline?", "Yes, the sea meets the land along a wavy coast.", "presence"),
    ("Which side of the image is sea?", "The left side: the dark, smooth area is water.", "scene"),
    ("Is most of this scene water or land?", None, "scene"),
    ("Would you call this area urban or natural?", "Mostly natural coast, with a few man-made targets.", "scene"),
    ("What does the dark, smooth region show?", "Calm sea, which returns little radar energy.", "scene"),
    ("Why do some spots look so bright here?", "Metal structures and corners reflect radar strongly.", "scene"),
]


def _sar_questions(scene: SarScene, i: int) -> list[tuple[str, str, str]]:
    """Three tool-free questions per scene (sensor, coast, sea or land, look), answered from what it holds and often
    wrapped in a greeting and a sign-off, like the requests."""
    from geopilot.data_gen.wording import wrap

    rng = random.Random(f"sar-{i}")
    picked = [SAR_QUESTIONS[(3 * i + k) % len(SAR_QUESTIONS)] for k in range(3)]
    water = "Mostly water." if scene.sea_fraction > 0.5 else "Mostly land."
    return [(wrap(question, rng), answer or water, kind) for question, answer, kind in picked]


def write_sarlang(root: Path, scenes: list[SarScene]) -> dict:
    captions, questions, records = [], [], {}
    for i, scene in enumerate(scenes):
        name = f"SV_Synth_{i}.png"
        _png(_sar_pixels(scene), root / "SARimages" / name)
        counts = Counter(o.label for o in scene.objects)
        listed = ", ".join(f"{n} {label if n == 1 else _plural(label)}" for label, n in sorted(counts.items()))
        captions.append([name, f"A SAR image of a coastline, showing {listed or 'no targets'}."])
        for label in sorted(counts):
            questions.append([name, f"How many {_plural(label)} are in the image?", str(counts[label]), "counting"])
        asked = _sar_questions(scene, i)
        questions += [[name, question, answer, kind] for question, answer, kind in asked]
        records[name[:-4]] = {"dialogues": 1 + len(counts) + len(asked)}
    _csv(root / "Text" / "caption" / "Caption-training.csv", ["image_name", "caption"], captions)
    _csv(root / "Text" / "VQA" / "SARVQA1_train.csv", ["image_name", "question", "answer", "type"], questions)
    return {"reader": "sarlang", "root": "SARLANG-1M", "split": "train", "records": records}


OPTICAL_WRITERS = {
    "DOTA": write_dota,
    "RiSBench": write_risbench,
    "OpenEarthMap": write_openearthmap,
    "SpaceNet": write_spacenet,
    "CityScale": write_cityscale,
    "RICE": write_rice,
    "iSAID": write_isaid,
    "GeoChat-Instruct": write_geochat,
}
SAR_WRITERS = {"SARDet-100K": write_sardet, "SARLANG-1M": write_sarlang}
PAIR_WRITERS = {"LEVIR-CD": write_levir_cd, "LEVIR-CC": write_levir_cc}  # one pair per optical scene
MANIFEST = "synth_manifest.json"


def write_synthetic(out: Path, seed: int = 0, optical: int = 6, sar: int = 6) -> dict:
    """Write every dataset above under `out`; returns (and writes) the manifest of what was placed."""
    if optical < 0 or sar < 0 or optical > 1000 or sar > 1000:
        raise GeoPilotInputError(f"synth: scene counts must be in 0..1000, got optical={optical} sar={sar}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise GeoPilotInputError(f"synth: --out {str(out)!r} exists and is not a folder")
    optical_scenes = [optical_scene(np.random.default_rng([seed, 0, i])) for i in range(optical)]
    sar_scenes = [sar_scene(np.random.default_rng([seed, 1, i]), sixteen_bit=i % 2 == 1) for i in range(sar)]
    datasets = {}
    for name, writer in OPTICAL_WRITERS.items():
        datasets[name] = writer(out / name, optical_scenes)
    for name, writer in SAR_WRITERS.items():
        datasets[name] = writer(out / name, sar_scenes)
    pairs = change_pairs(seed, optical)
    for name, writer in PAIR_WRITERS.items():
        datasets[name] = writer(out / name, pairs)
    manifest = {"seed": seed, "optical": optical, "sar": sar, "size": SIZE, "datasets": datasets}
    _text(out / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    return manifest
