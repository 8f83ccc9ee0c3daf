"""`geopilot synth`: scenes written in the real formats read back by the readers with what synth placed."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import rasterio
from PIL import Image

from geopilot.cli import main
from geopilot.data_gen.readers import READERS
from geopilot.data_gen.synthetic.datasets import MANIFEST, write_synthetic
from geopilot.data_gen.synthetic.scenes import SIZE
from geopilot.image import load_image
from geopilot.vocabulary import dataset_classes, default_vocabulary


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("synth")
    return out, write_synthetic(out, seed=3, optical=5, sar=4)


def read(out: Path, entry: dict):
    records, report = READERS[entry["reader"]](out / entry["root"], split=entry["split"])
    assert report.skipped == {}, report.examples
    return {r.record_id: r for r in records}


def by_id(record) -> str:
    return record.record_id


def test_every_dataset_reads_back_with_the_records_synth_placed(synth):
    out, manifest = synth
    assert set(manifest["datasets"]) == {
        "DOTA",
        "RiSBench",
        "OpenEarthMap",
        "SpaceNet",
        "CityScale",
        "RICE",
        "iSAID",
        "GeoChat-Instruct",
        "SARDet-100K",
        "SARLANG-1M",
        "LEVIR-CD",
        "LEVIR-CC",
    }
    for name, entry in manifest["datasets"].items():
        records = read(out, entry)
        assert set(records) == set(entry["records"]), name
        assert len(records) >= 1, name
    assert len(read(out, manifest["datasets"]["DOTA"])) == 5 and len(read(out, manifest["datasets"]["SARLANG-1M"])) == 4


def test_detection_round_trip_counts_classes_and_boxes(synth):
    out, manifest = synth
    for name in ("DOTA", "iSAID", "SARDet-100K"):
        vocabulary = set(dataset_classes(name))  # readers write canonical class names
        entry = manifest["datasets"][name]
        records = read(out, entry)
        total = 0
        for record_id, record in records.items():
            counts = Counter(o.label for o in record.objects)
            assert counts == entry["records"][record_id]["objects"], (name, record_id)
            assert set(counts) <= vocabulary
            for obj in record.objects:
                x1, y1, x2, y2 = obj.box
                assert 0 <= x1 < x2 <= 1 and 0 <= y1 < y2 <= 1
            total += len(record.objects)
        assert total >= 2 * len(records)  # synth places at least 2 objects per scene
    dota = read(out, manifest["datasets"]["DOTA"])
    assert all(len(o.polygon) == 4 for r in dota.values() for o in r.objects)  # DOTA keeps the oriented box


def test_sar_images_are_single_channel_speckled_and_some_16_bit(synth):
    out, manifest = synth
    records = read(out, manifest["datasets"]["SARDet-100K"])
    modes = set()
    for record in records.values():
        with Image.open(record.image) as im:
            modes.add(im.mode)
            values = np.asarray(im)
        assert values.ndim == 2
        sea = values[values < np.percentile(values, 30)]
        assert values.std() > 0 and sea.std() > 0  # speckle, not flat fill
        assert record.modality == "sar"
        loaded = load_image(record.image)  # the core loader stretches 16-bit and replicates to 3 bands
        assert loaded.image.mode == "RGB" and loaded.image.size == (record.width, record.height)
    assert modes == {"L", "I;16"}


def test_referring_round_trip_matches_the_object_synth_described(synth):
    out, manifest = synth
    entry = manifest["datasets"]["RiSBench"]
    records = read(out, entry)
    assert records, "synth placed no uniquely describable object"
    for record_id, record in records.items():
        placed = entry["records"][record_id]
        assert [r.expression for r in record.referring] == placed["phrases"]
        (obj,) = record.objects
        # rasterised mask bounds vs the drawn outline's bounds: within a pixel and a half (a car is 8 x 5 px)
        assert max(abs(a - b) for a, b in zip(obj.box, placed["box"], strict=True)) * SIZE < 1.5
        assert obj.mask is not None


def test_isaid_masks_and_geochat_conversations_round_trip(synth):
    out, manifest = synth
    for record in read(out, manifest["datasets"]["iSAID"]).values():
        assert record.objects and all(o.mask is not None and len(o.polygon) >= 4 for o in record.objects)
    entry = manifest["datasets"]["GeoChat-Instruct"]
    for record_id, record in read(out, entry).items():
        placed = entry["records"][record_id]
        assert record.dialogues[0].task == placed["task"] and len(record.objects) == placed["objects"]
        if placed["task"] == "refer":
            (obj,) = record.objects
            x1, y1, x2, y2 = placed["box"]  # the 0-100 grid box holds the object, at most one grid step larger
            assert obj.box[0] <= x1 and obj.box[1] <= y1 and obj.box[2] >= x2 and obj.box[3] >= y2
            assert max(x1 - obj.box[0], y1 - obj.box[1], obj.box[2] - x2, obj.box[3] - y2) <= 0.01 + 1e-9
            assert record.referring[0].object_indices == (0,)
        else:  # counting VQA and the scene questions (description, dominant land cover, presence)
            assert record.dialogues[0].turns[1][1] == placed["answer"]


def test_land_cover_roads_and_cloud_pairs_round_trip(synth):
    out, manifest = synth
    datasets = manifest["datasets"]
    for record_id, record in read(out, datasets["OpenEarthMap"]).items():
        with rasterio.open(record.semantic.mask_path) as label:
            codes = sorted(int(c) for c in np.unique(label.read(1)))
        assert codes == datasets["OpenEarthMap"]["records"][record_id]["codes"]
        assert 4 in codes  # roads are painted into the land cover
    for name in ("SpaceNet", "CityScale"):
        for record_id, record in read(out, datasets[name]).items():
            placed = datasets[name]["records"][record_id]
            assert (len(record.roads.nodes), len(record.roads.edges)) == (placed["nodes"], placed["edges"]), name
    for record in read(out, datasets["RICE"]).values():
        cloudy = np.asarray(Image.open(record.image), dtype=np.float64)
        clear = np.asarray(Image.open(record.cloud_free_image), dtype=np.float64)
        assert cloudy.shape == clear.shape and cloudy.mean() > clear.mean()  # clouds brighten the scene
    for record_id, record in read(out, datasets["SARLANG-1M"]).items():
        assert len(record.dialogues) == datasets["SARLANG-1M"]["records"][record_id]["dialogues"]
        assert record.dialogues[0].task == "caption"


def test_spacenet_road_nodes_land_on_the_painted_roads(synth):
    out, manifest = synth
    for record in read(out, manifest["datasets"]["SpaceNet"]).values():
        with rasterio.open(record.image) as dataset:
            assert dataset.crs.to_epsg() == 4326
    labels = read(out, manifest["datasets"]["OpenEarthMap"])
    spacenet = read(out, manifest["datasets"]["SpaceNet"])
    for oem, roads in zip(sorted(labels.values(), key=by_id), sorted(spacenet.values(), key=by_id), strict=True):
        with rasterio.open(oem.semantic.mask_path) as label:
            codes = label.read(1)
        inner = [(x, y) for x, y in roads.roads.nodes if 0.02 < x < 0.98 and 0.02 < y < 0.98]
        assert inner
        for x, y in inner:  # the same scene: every interior road node sits on road pixels (code 4)
            assert codes[int(y * oem.height), int(x * oem.width)] == 4


def test_cityscale_and_spacenet_graphs_of_one_scene_agree(synth):
    out, manifest = synth
    cityscale = sorted(read(out, manifest["datasets"]["CityScale"]).values(), key=lambda r: int(r.record_id[7:]))
    spacenet = sorted(read(out, manifest["datasets"]["SpaceNet"]).values(), key=by_id)
    for pickled, geojson in zip(cityscale, spacenet, strict=True):  # (row, col) pickle vs lon/lat GeoJSON
        assert len(pickled.roads.nodes) == len(geojson.roads.nodes)
        for a, b in zip(pickled.roads.nodes, geojson.roads.nodes, strict=True):
            assert a == pytest.approx(b, abs=1 / 256)  # CityScale keys are whole pixels


def test_same_seed_same_bytes_other_seed_other_scenes(tmp_path):
    def digest(folder: Path) -> dict[str, str]:
        return {
            p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))
            if p.is_file()
        }

    write_synthetic(tmp_path / "a", seed=7, optical=2, sar=2)
    write_synthetic(tmp_path / "b", seed=7, optical=2, sar=2)
    write_synthetic(tmp_path / "c", seed=8, optical=2, sar=2)
    a, b, c = digest(tmp_path / "a"), digest(tmp_path / "b"), digest(tmp_path / "c")
    assert a == b
    assert a["DOTA/train/images/P0000.png"] != c["DOTA/train/images/P0000.png"]


def test_cli_writes_the_default_set_and_reports_bad_input(tmp_path, capsys):
    assert main(["synth", "--out", str(tmp_path / "out"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["datasets"]["DOTA"]["records"] == 6 and summary["datasets"]["SARDet-100K"]["records"] == 6
    assert summary["seconds"] < 60  # generous: the target (< 5 s) is measured outside the test suite
    assert json.loads((tmp_path / "out" / MANIFEST).read_text())["seed"] == 0
    (tmp_path / "file").write_text("x")
    assert main(["synth", "--out", str(tmp_path / "file")]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert main(["synth", "--out", str(tmp_path / "file" / "below")]) == 2  # cannot create a folder under a file
    assert "cannot write" in capsys.readouterr().err
    assert main(["synth", "--out", str(tmp_path / "o2"), "--sar", "-1"]) == 2
    assert main(["synth"]) == 2  # --out is required


def test_optical_scenes_hold_every_dota_class_and_describe_referents_several_ways():
    from geopilot.data_gen.synthetic.scenes import OPTICAL_SHAPES, optical_scene

    scenes = [optical_scene(np.random.default_rng([0, 0, i])) for i in range(40)]
    seen = Counter(o.label for scene in scenes for o in scene.objects)
    canonical = {default_vocabulary().lookup(label, "DOTA v1.0") for label in OPTICAL_SHAPES}
    assert canonical == set(dataset_classes("DOTA v1.0"))
    assert set(seen) == set(OPTICAL_SHAPES)  # every class is placed somewhere, so every class is asked about
    phrases = [p for scene in scenes if scene.referring for p in scene.referring[1]]
    assert any(p.startswith(("the largest", "the smallest")) for p in phrases)
    assert any(colour in p for p in phrases for colour in ("white", "blue", "yellow", "green"))
    assert len({p.split(" ", 2)[-1] for p in phrases}) > 30
