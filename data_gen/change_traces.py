"""Two-image traces for bi-temporal pairs: change detection and change captioning.

A change-detection trace is user (two `<image>`, one question) -> think (`detect_changes`) -> tool -> answer, for
three intents worded by the query grammar (`geopilot.data_gen.wording`): what changed (the changed regions and
where), how many buildings came or went (the changed regions counted), and what share of the area changed. Its tool
turn is the ground truth: the change output built from the pair's label (`geopilot.tools.change_output`), so the
change mask is exactly the labelled changed pixels and its regions are the label's 8-connected components; the
answer is computed from that output. A change-captioning trace is tool-free: the same two images, a request for a
description, and one of the pair's reference captions (LEVIR-CC) as the answer.

Texts are written here from the grammar and templates, whatever the run's LLM backend, like the chain traces, and
apart from the evaluation's change questions (`geopilot.eval.planning_set`).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
from PIL import Image

from geopilot.data_gen.readers.common import CHANGE_CAPTION
from geopilot.data_gen.wording import compose, wrap
from geopilot.records import AnnotationRecord
from geopilot.sample import IMAGE_PLACEHOLDER, Action, AssistantMessage, ToolMessage, UserMessage
from geopilot.tool_output import Artifact, ToolOutput

CHANGE_DETECTION = "change_detection"
CHANGE_CAPTIONING = "change_captioning"
CHANGE_TOOL = "detect_changes"
INTENTS = ("change_what", "change_count", "change_share")  # the grammar's change-detection intents
# detect_changes' params per intent: both images in their order (the default); buildings named when counting them
CHANGE_PARAMS: dict[str, dict] = {"change_what": {}, "change_count": {"classes": ["building"]}, "change_share": {}}
# what a changed region of a source is: LEVIR-CD labels building change, as BIT trained on it reports
CHANGE_LABELS = {"LEVIR-CD": "building"}
LISTED_REGIONS = 5  # the answer to "what changed" names the largest regions, then says how many more
PLANS = {
    "change_what": [
        "I compare the two images with the change detector to find where they differ.",
        "To see what changed I run change detection on the before and after images.",
    ],
    "change_count": [
        "I detect the building changes between the two dates and count the changed regions.",
        "Counting changed buildings needs the change detector on both images, restricted to buildings.",
    ],
    "change_share": [
        "The changed share of the area comes from the change mask of the two images.",
        "I run change detection on the pair and read the changed fraction.",
    ],
}


def pair_prompt(query: str, images: int = 2) -> str:
    """The first user turn of a several-image sample: one `<image>` per image, in order, then the request."""
    return "\n".join([IMAGE_PLACEHOLDER] * images + [query])


def has_change_label(record: AnnotationRecord) -> bool:
    return record.after_image is not None and record.change_mask is not None


def change_captions(record: AnnotationRecord) -> list[str]:
    """The pair's reference change captions (LEVIR-CC: five), in the source's order."""
    if record.after_image is None:
        return []
    return [text for d in record.dialogues if d.task == CHANGE_CAPTION for role, text in d.turns if role == "assistant"]


def read_change_mask(path: str | Path) -> np.ndarray:
    """A change label file (0 / 255, or 0 / 1; one band or RGB) -> boolean (H, W) mask, nonzero = changed."""
    from geopilot.tools.change_output import label_mask

    with Image.open(path) as label:
        return label_mask(np.asarray(label))


def label_output(record: AnnotationRecord, image_artifact: Path | None = None) -> ToolOutput:
    """The `detect_changes` output of a labelled pair, computed from its label: the mask is the labelled changed
    pixels. `image_artifact`: where to write the after image with the unchanged pixels black (the image artefact a
    chain counts or segments in); the mask artefact is the label file itself."""
    from geopilot.tools.change_output import change_output

    mask = read_change_mask(record.change_mask)
    if mask.shape != (record.height, record.width):
        raise ValueError(
            f"change label {record.change_mask} is {mask.shape[1]}x{mask.shape[0]}, the image is "
            f"{record.width}x{record.height}"
        )
    artifacts = []
    if image_artifact is not None:
        if not image_artifact.is_file():
            with Image.open(record.after_image) as after:
                pixels = np.asarray(after.convert("RGB")).copy()
            pixels[~mask] = 0
            image_artifact.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(image_artifact)
        artifacts.append(Artifact(kind="image", path=str(image_artifact.resolve())))
    artifacts.append(Artifact(kind="mask", path=str(Path(record.change_mask).resolve())))
    label = CHANGE_LABELS.get(record.source, "change")
    return change_output(mask, label=label, artifacts=artifacts, provenance="annotations")


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.2f}%"


def _position(box: tuple[float, float, float, float]) -> str:
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    row = "top" if cy < 1 / 3 else "bottom" if cy > 2 / 3 else "middle"
    col = "left" if cx < 1 / 3 else "right" if cx > 2 / 3 else "centre"
    return "centre" if (row, col) == ("middle", "centre") else f"{row} {col}" if row != "middle" else f"middle {col}"


def change_answer(intent: str, output: ToolOutput) -> tuple[str, str]:
    """(reasoning, answer) of the final turn, computed from the change output."""
    data = output.data or {}
    fraction, count = float(data.get("changed_fraction", 0.0)), int(data.get("changed_objects", 0))
    regions = output.detections
    if count == 0:
        return "The change mask is empty.", "Nothing changed between the two images."
    if intent == "change_count":
        noun = "building" if count == 1 else "buildings"
        return (
            "Each changed region of the mask is one building that appeared or disappeared.",
            f"{count} {noun} changed between the two images (built or removed), covering {_percent(fraction)} of "
            "the area.",
        )
    if intent == "change_share":
        return (
            "From the changed fraction of the mask.",
            f"{_percent(fraction)} of the area changed, in {count} region{'s' if count != 1 else ''}.",
        )
    listed = [f"[{', '.join(str(v) for v in d.box)}] ({_position(d.box)})" for d in regions[:LISTED_REGIONS]]
    more = f", and {count - LISTED_REGIONS} smaller ones" if count > LISTED_REGIONS else ""
    kind = regions[0].label
    return (
        "From the changed regions, largest first.",
        f"{count} {kind} change{'s' if count != 1 else ''} ({_percent(fraction)} of the area): "
        + "; ".join(listed)
        + more
        + ".",
    )


def change_detection_messages(
    record: AnnotationRecord, rng: random.Random, image_artifact: Path | None = None
) -> tuple[list, str]:
    """(messages, difficulty) of one change-detection trace of a labelled pair."""
    intent = rng.choice(INTENTS)
    difficulty = rng.choice(("easy", "medium", "hard"))
    query = wrap(compose(intent, difficulty, rng).replace("{modality}", record.modality), rng)
    action = Action(tool=CHANGE_TOOL, params=dict(CHANGE_PARAMS[intent]))
    output = label_output(record, image_artifact)
    reasoning, answer = change_answer(intent, output)
    return [
        UserMessage(content=pair_prompt(query)),
        AssistantMessage(reasoning=rng.choice(PLANS[intent]), actions=[action]),
        ToolMessage(name=CHANGE_TOOL, content=output),
        AssistantMessage(reasoning=reasoning, value=answer),
    ], difficulty


def change_caption_messages(record: AnnotationRecord, k: int, rng: random.Random) -> list:
    """A tool-free trace: a request to describe the change, answered with the pair's k-th reference caption."""
    captions = change_captions(record)
    if not captions:
        raise ValueError(f"{record.record_id}: no change caption")
    caption = captions[k % len(captions)]
    query = wrap(compose("change_caption", rng.choice(("easy", "medium", "hard")), rng), rng)
    answer = caption[:1].upper() + caption[1:]
    return [
        UserMessage(content=pair_prompt(query.replace("{modality}", record.modality))),
        AssistantMessage(reasoning="Comparing the earlier image with the later one.", value=answer),
    ]
