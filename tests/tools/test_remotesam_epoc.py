"""RemoteSAM's EPOC contour refinement (issue 23 item 4) against upstream's pipeline, on a tiny DirectSAM.

Upstream: github.com/1e12Leon/RemoteSAM (no licence: reimplemented here from the source, lines cited):
- `tasks/code/model.py` L78-82: the contour model is `AutoModelForSemanticSegmentation.from_pretrained(
  "chendelong/DirectSAM-EntitySeg-1024px-0501", num_labels=1, ignore_mismatched_sizes=True)` with its
  `AutoImageProcessor` (a transformers Segformer, whose published config.json has MiT-b5 sizes);
- `utils.py` L436-450 (`EPOC.run`): processor -> logits.float() -> bilinear to the image size -> sigmoid;
- `tasks/code/model.py` L181-191 (`detection`): `refined = mask * (1 - (contour > EPOC_threshold))`, then
  `utils.M2B(mask, prob, new_mask=refined)` = `M2B_wEPOC` (L233-272) with area_threshold 0.2, then remove_inner
  (L355-364) and NMS 0.5 (L194-196). cv2.connectedComponentsWithStats is stood in for by scipy's 8-connected labels
  (same components; the box is stats' x, y, x+w, y+h).
A tiny random model of DirectSAM's architecture is built in-process and saved as the model repository's files.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.weights import FIXTURES
from PIL import Image
from scipy import ndimage
from transformers import (
    AutoImageProcessor,
    AutoModelForSemanticSegmentation,
    SegformerConfig,
    SegformerForSemanticSegmentation,
    SegformerImageProcessorPil,
)

from geopilot.loaded_image import LoadedImage
from geopilot.tools.adapters import MaskSegmenterAdapter
from geopilot.tools.remotesam import RemoteSam, instances, refined_components
from geopilot.tools.remotesam_epoc import EPOC_DIR, EpocContours, refine
from geopilot.tools.remotesam_keymap import upstream_key_to_ours
from geopilot.tools.task_tools import TASKS_BY_NAME


def _tiny_directsam(folder, seed: int = 0) -> None:
    """DirectSAM's architecture (Segformer, 4 stages, one output channel) at toy widths, saved as float16 like the
    published checkpoint, with a PIL Segformer processor at 64 px."""
    torch.manual_seed(seed)
    config = SegformerConfig(
        depths=[1, 1, 1, 1],
        hidden_sizes=[8, 16, 24, 32],
        num_attention_heads=[1, 1, 2, 2],
        decoder_hidden_size=16,
        num_labels=1,
    )
    model = SegformerForSemanticSegmentation(config).eval()
    with torch.no_grad():  # the default init (std 0.02) leaves every probability at 0.5000: spread the logits
        model.decode_head.classifier.weight.mul_(300.0)
    model.half().save_pretrained(str(folder))
    SegformerImageProcessorPil(size={"height": 64, "width": 64}).save_pretrained(str(folder))


def _upstream_epoc(folder, image: Image.Image) -> np.ndarray:
    """model.py L80-82 + utils.py L436-450 (pyramid_layers=0: the global pass only), on CPU."""
    processor = AutoImageProcessor.from_pretrained(str(folder), reduce_labels=True, backend="pil")
    model = AutoModelForSemanticSegmentation.from_pretrained(
        str(folder), num_labels=1, ignore_mismatched_sizes=True, dtype=torch.float32
    ).eval()
    pixel_values = processor(image, return_tensors="pt").pixel_values.to(model.dtype)
    with torch.no_grad():
        logits = model(pixel_values=pixel_values).logits.float()
    upsampled = F.interpolate(logits, size=image.size[::-1], mode="bilinear", align_corners=False)
    return torch.sigmoid(upsampled)[0, 0].numpy()


def _cv2_components(mask: np.ndarray):
    """cv2.connectedComponentsWithStats(mask, connectivity=8) -> (count incl. background, labels, stats)."""
    labels, count = ndimage.label(mask, structure=np.ones((3, 3), dtype=bool))
    stats = [[0, 0, 0, 0, int((labels == 0).sum())]]
    for j, (rows, cols) in enumerate(ndimage.find_objects(labels), start=1):
        stats.append([cols.start, rows.start, cols.stop - cols.start, rows.stop - rows.start, int((labels == j).sum())])
    return count + 1, labels, stats


def _upstream_m2b_with_epoc(ori_mask, new_mask, probs, area_threshold=0.2, conf_threshold=0.01):
    """utils.py L233-272 (box_type 'hbb')."""
    _, label_new, stats_new = _cv2_components(new_mask)
    num, label_ori, _ = _cv2_components(ori_mask)
    reserve = []
    for i in range(1, num):
        covered = np.unique(np.where(label_ori == i, label_new, 0))
        covered = covered[covered != 0]
        if len(covered) == 0:
            continue
        max_area = max(stats_new[j][-1] for j in covered)
        reserve += [j for j in covered if stats_new[j][-1] > max_area * area_threshold]
    boxes = []
    for j in reserve:
        conf = float(np.sum(probs * (label_new == j)) / stats_new[j][-1])
        if conf >= conf_threshold:
            x, y, w, h, _ = stats_new[j]
            boxes.append(((x, y, x + w, y + h), conf))
    return boxes


def _touching_pair() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two tanks whose masks touch (one component), DirectSAM's contour between them, and a 2-px splinter."""
    mask = np.zeros((48, 64), dtype=bool)
    mask[10:30, 8:30] = True
    mask[10:30, 30:52] = True  # touches the first: one component without EPOC
    prob = np.where(mask, 0.8, 0.05).astype(np.float32)
    prob[10:30, 30:52] = 0.6
    contours = np.full(mask.shape, 0.02, dtype=np.float32)
    contours[:, 29:31] = 0.9  # the shared edge
    contours[10:30, 50] = 0.4  # cuts a 1-px sliver (x = 51) off the second tank: < 0.2 x its area, dropped
    return mask, prob, contours


def test_contour_probability_is_upstreams_epoc_on_the_same_weights(tmp_path):
    _tiny_directsam(tmp_path)
    image = Image.fromarray(np.random.default_rng(5).integers(0, 255, (50, 70, 3), dtype=np.uint8))
    ours = EpocContours.from_folder(tmp_path, torch.device("cpu")).probability(image)
    expected = _upstream_epoc(tmp_path, image)
    assert ours.shape == (50, 70) and ours.dtype == np.float32
    assert np.abs(ours - expected).max() <= 1e-6
    assert ours.std() > 0.01  # a real map, not a constant


def test_refinement_splits_touching_objects_as_upstreams_m2b_with_epoc():
    mask, prob, contours = _touching_pair()
    refined = refine(mask, contours, 0.25)
    ours = [(c.box, c.score) for c in refined_components(mask, refined, prob)]
    expected = _upstream_m2b_with_epoc(mask.astype(np.uint8), refined.astype(np.uint8), prob)
    assert [box for box, _ in ours] == [box for box, _ in expected] == [(8, 10, 29, 30), (31, 10, 50, 30)]
    assert np.allclose([s for _, s in ours], [s for _, s in expected], atol=1e-6)
    assert [c.box for c in instances(mask, prob)] == [(8, 10, 52, 30)]  # unrefined: one merged box
    assert len(instances(mask, prob, refined=refined)) == 2


def test_segment_instances_counts_refined_objects_and_says_when_it_cannot(tmp_path, monkeypatch):
    mask, prob, contours = _touching_pair()
    tiny = RemoteSam.tiny(seed=0)
    monkeypatch.setattr(tiny, "predict", lambda image, sentence, tiled=False: (mask, prob))
    adapter = MaskSegmenterAdapter(tiny)
    image = LoadedImage(Image.new("RGB", (64, 48)))
    params = TASKS_BY_NAME["segment_instances"].params_model(categories=["storage tank"])
    unrefined = adapter.run("segment_instances", image, params)
    assert len(unrefined.detections) == 1
    assert "unrefined masks" in unrefined.message and "counts can come out low" in unrefined.message

    class FixedContours:
        def probability(self, picture):
            assert picture.size == (64, 48)
            return contours

    tiny.contours = FixedContours()
    refined = adapter.run("segment_instances", image, params)
    assert len(refined.detections) == 2 and refined.message is None


def _tiny_remotesam_checkpoint(folder) -> None:
    """A tiny RemoteSAM checkpoint under upstream's names (as tests/tools/test_remotesam_keymap.py builds one)."""
    model = RemoteSam.tiny(seed=3)
    ours = model.net.state_dict()
    upstream = json.loads((FIXTURES / "remotesam_upstream_keys.json").read_text())
    by_ours = {upstream_key_to_ours(k): k for k in upstream}
    torch.save({"model": {by_ours[k]: v for k, v in ours.items()}}, folder / "checkpoint.pth")
    model.tokenizer.save_pretrained(str(folder / "bert-base-uncased"))


def test_from_weights_loads_a_local_directsam_folder_or_names_where_it_goes(tmp_path, caplog):
    _tiny_remotesam_checkpoint(tmp_path)
    without = RemoteSam.from_weights(tmp_path, architecture="tiny")
    assert without.contours is None and f"put {EPOC_DIR} at {tmp_path / EPOC_DIR}" in without.instance_note
    off = RemoteSam.from_weights(tmp_path, architecture="tiny", use_epoc=False)
    assert "use_epoc: false" in off.instance_note
    _tiny_directsam(tmp_path / EPOC_DIR)
    with caplog.at_level("WARNING", logger="geopilot.tools"):
        model = RemoteSam.from_weights(tmp_path, architecture="tiny", epoc_threshold=0.15)
    assert isinstance(model.contours, EpocContours) and model.instance_note is None and model.epoc_threshold == 0.15
    assert next(model.contours.model.parameters()).dtype == torch.float32  # fp16 on disk, fp32 as upstream runs it
    assert any("float16 are converted to float32" in r.message for r in caplog.records)
    found = model.segment_instances(Image.new("RGB", (64, 64), (90, 120, 60)), ["ship"])
    assert all(0.0 <= d.box[0] <= d.box[2] <= 1.0 for d in found)


def test_a_broken_directsam_folder_is_one_clear_error(tmp_path):
    from geopilot.errors import WeightsError

    _tiny_directsam(tmp_path)
    (tmp_path / "preprocessor_config.json").unlink()
    with pytest.raises(WeightsError, match="lacks preprocessor_config.json"):
        EpocContours.from_folder(tmp_path, torch.device("cpu"))
    _tiny_directsam(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["id2label"] = {"0": "a", "1": "b"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match="one output channel"):
        EpocContours.from_folder(tmp_path, torch.device("cpu"))
