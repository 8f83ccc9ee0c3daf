"""The offline template client: writes every generation stage from the request's facts, with no LLM at all.

Seeded per request (so the same seed gives the same text whatever the run's concurrency), with several
paraphrase templates per ability and difficulty. It answers the very requests an LLM would get and replies in
the same JSON, so its output goes through the same parsing, validation and regeneration as an LLM's.
"""

from __future__ import annotations

import json
import random
import re

from geopilot.data_gen.llm import CallInfo, LLMRequest
from geopilot.data_gen.wording import compose, sentence, wrap
from geopilot.sample import IMAGE_PLACEHOLDER
from geopilot.vocabulary import class_synonyms, default_vocabulary

QUERIES: dict[str, dict[str, list[str]]] = {
    "panoptic_detection": {
        "easy": [
            "Detect all objects in this image.",
            "Find and label every object in this {modality} image.",
            "Run a full detection over this scene and list what you find.",
            "Find everything in this {modality} image and box it.",
            "Box all the targets you can see in this image.",
            "Detect every target in this {modality} image.",
            "Spot all objects in this image, whatever they are.",
            "List all the objects in this scene together with their boxes.",
        ],
        "medium": [
            "What objects can you see in this image, and where are they?",
            "Which kinds of objects appear in this scene, and how many of each?",
            "Can you give me an inventory of the objects in this {modality} image?",
            "What targets are there in this {modality} image?",
            "Tell me what is in this scene and where each thing is.",
            "Could you find all the objects here and say what they are?",
        ],
        "hard": [
            "I need a complete inventory of this scene for a change-detection baseline: what is in it, and where?",
            "Before I annotate this tile by hand, tell me everything that is in it, with locations.",
            "Summarise the man-made objects in this {modality} scene with their positions.",
            "I have no idea what this {modality} tile contains; find all the objects and where they sit.",
            "For a site survey, list every object you can detect here with its location.",
        ],
    },
    "object_detection": {
        "easy": [
            "Detect the {targets} in this image.",
            "Find all {targets} in the image.",
            "Locate every one of the {targets} in this picture.",
            "Draw bounding boxes around the {targets}.",
            "Highlight all the {targets} in this {modality} image.",
            "Mark the {targets} in this image with boxes.",
            "Spot the {targets} in this image.",
            "Run a detector for {targets} on this image.",
            "Identify and box the {targets} here.",
            "Please find the {targets} and draw a box around each.",
        ],
        "medium": [
            "How many {targets} are there in this image?",
            "Where are the {targets} in this scene?",
            "Can you count the {targets} visible here?",
            "Count the {targets} and give me their boxes.",
            "What is the number of {targets} in this image?",
            "Give me a count of the {targets} in this image.",
            "Tally the {targets} in this image, please.",
            "How many {targets} can you spot, and where?",
            "Could you enumerate the {targets} in this scene?",
            "Are there {targets} in this image? Show me where they are.",
        ],
        "hard": [
            "I'm assessing activity here: how many {targets} are present, and where are they?",
            "For a capacity estimate, locate and count the {targets} in this scene.",
            "Is there much going on with {targets} in this image? Give me their number and positions.",
            "I'm checking a logistics site: count the {targets} and tell me where each one is.",
            "For an inventory report I need the number of {targets} and their locations.",
            "Keep count of the {targets} in this image and mark each of them.",
            "My survey needs every one of the {targets} boxed and counted; can you do it?",
        ],
    },
    "visual_grounding": {
        "easy": [
            "Locate {expression}.",
            "Find {expression} in the image.",
            "Draw a box around {expression}.",
            "Highlight {expression} with a bounding box.",
            "Mark {expression} with a box.",
            "Detect {expression} in this image.",
            "Give me the bounding box of {expression}.",
            "Point to {expression} in this image.",
        ],
        "medium": [
            "Where is {expression} in this image?",
            "Can you show me where {expression} is?",
            "Which part of the image contains {expression}?",
            "Where exactly can I find {expression}?",
            "Could you locate {expression} in this scene?",
            "What are the coordinates of {expression}?",
        ],
        "hard": [
            "I need the exact position of {expression} for my report. Can you find it?",
            "Please pinpoint {expression}; I want to crop around it.",
            "Mark {expression} so I can check it against the map.",
            "I'm verifying a map: please spot {expression} and report its box.",
            "Someone told me about {expression}; show me where it is in this image.",
        ],
    },
    "semantic_segmentation": {
        "easy": [
            "Segment the {classes} in this image.",
            "Produce a segmentation of {classes} for this scene.",
            "Map the {classes} in this image.",
            "Classify the pixels of {classes} in this image.",
            "Make a land-cover mask of {classes}.",
            "Delineate the {classes} in this scene.",
            "Show the {classes} as a segmentation map.",
            "Colour the {classes} areas in this image.",
        ],
        "medium": [
            "How much of this image is covered by {classes}?",
            "Where are the {classes} areas in this scene?",
            "Can you show me the {classes} regions here?",
            "What share of this tile is {classes}?",
            "How large is the {classes} area in this image?",
            "Which parts of the scene are {classes}?",
        ],
        "hard": [
            "For a land-cover summary, what share of this scene is {classes}?",
            "I'm estimating land use for planning: how is {classes} distributed in this tile?",
            "Quantify the {classes} in this scene so I can compare it with last year's survey.",
            "Our environmental report needs to know how much {classes} is here; can you measure it?",
            "How dominant is {classes} in this tile? Measure it pixel by pixel.",
        ],
    },
    "instance_segmentation": {
        "easy": [
            "Segment each of the {targets} in this image.",
            "Outline every one of the {targets} individually.",
            "Give me instance masks of the {targets}.",
            "Create a separate mask per object for the {targets}.",
            "Run instance segmentation for the {targets}.",
            "Segment the {targets} one by one.",
        ],
        "medium": [
            "Can you separate the individual {targets} in this scene?",
            "How many {targets} are there, and what does each one cover?",
            "Which areas do the {targets} occupy, one by one?",
            "What is the footprint of each of the {targets}?",
            "Delineate the {targets} individually and tell me their sizes.",
        ],
        "hard": [
            "I want to measure the footprint of each of the {targets} here. Can you delineate them?",
            "For an inventory with sizes, outline the {targets} in this scene one by one.",
            "How much space does each of the {targets} take up in this image?",
            "Which of the {targets} is the biggest? Outline them all separately first.",
            "A planner needs the area of every individual one of the {targets}; work it out.",
        ],
    },
    "referring_segmentation": {
        "easy": [
            "Segment {expression}.",
            "Give me a mask of {expression}.",
            "Outline {expression} in this image.",
            "Create a segmentation mask for {expression}.",
            "Extract the shape of {expression} as a mask.",
        ],
        "medium": [
            "Which pixels belong to {expression}?",
            "Can you delineate {expression} for me?",
            "What area does {expression} cover?",
            "How big is {expression} in pixels?",
            "Draw the exact outline of {expression}.",
        ],
        "hard": [
            "I need the precise outline of {expression} to measure it. Can you extract it?",
            "Please cut out {expression} so I can check its extent.",
            "How large is {expression}? Outline it first.",
            "For my area estimate, segment {expression} and tell me how much it covers.",
        ],
    },
    "road_extraction": {
        "easy": [
            "Extract the road network from this image.",
            "Map the road network in this image.",
            "Trace all roads visible in this scene.",
            "Digitise the road network of this tile.",
            "Give me the roads of this image as a graph.",
            "Trace the streets of this image and build their graph.",
        ],
        "medium": [
            "What does the road network look like here?",
            "How many road intersections are there in this image?",
            "Can you give me the road graph of this scene?",
            "How long are the roads in this scene in total?",
            "How many crossings are there between the streets here?",
        ],
        "hard": [
            "I'm planning a delivery route here: how connected are the roads?",
            "Is this area well served by roads? Summarise the network.",
            "How dense is the road network in this tile compared with a typical town?",
            "Could a truck drive across this whole area? Work out the road connections.",
            "For an evacuation plan, describe how the roads here link up.",
        ],
    },
    "cloud_removal": {
        "easy": [
            "Remove the clouds from this image.",
            "Give me a cloud-free version of this image.",
            "Clear the clouds in this scene.",
            "Take the cloud cover off this image.",
            "Dehaze this cloudy image.",
            "Erase the clouds from this picture.",
        ],
        "medium": [
            "Can you show me what is under the clouds here?",
            "The clouds hide the ground. Can you restore a clear view?",
            "Could you produce a clear-sky version of this scene?",
            "What would this scene look like without the clouds?",
            "Can you see through the clouds in this image for me?",
        ],
        "hard": [
            "I can't see the fields under this cloud cover. Can you fix the image before I analyse it?",
            "This acquisition is too cloudy for mapping; make it usable.",
            "Prepare this cloudy scene for land-cover analysis.",
            "Clouds ruin this image for my survey; restore the surface so I can use it.",
        ],
    },
}
QUERIES["visual_grounding_sar"] = QUERIES["visual_grounding"]
PLAN_REASONING = [
    "The user asks about {subject}, which I cannot measure reliably by looking alone; {tool} returns exactly that, so I call it.",
    "To answer this I need {subject}. The {tool} tool provides it, so I will run it on the image.",
    "Answering requires {subject}; I'll use {tool} and then answer from its output.",
]
ANSWER_REASONING = [
    "The {tool} output gives {evidence}, which answers the question directly.",
    "From the {tool} result I can read {evidence}.",
    "{tool} returned {evidence}; I summarise it for the user.",
]
CAPTION_QUERIES = [
    "Describe this SAR image.",
    "What does this SAR scene show?",
    "Give a detailed description of this radar image.",
    "Write a caption for this SAR image.",
    "What can you see in this synthetic aperture radar image?",
]
CAPTION_REASONING = [
    "The bright, strongly backscattering structures and the surrounding texture in this SAR image indicate the main content of the scene.",
    "Looking at the backscatter intensity, the shapes and the speckle texture, I can identify the key elements of this radar scene.",
    "Strong returns mark man-made structures and smooth dark areas mark calm surfaces; together they describe the scene.",
]
DIALOGUE_REASONING = [
    "The question asks: {question} Looking at the visible content of the image, the answer follows directly.",
    "To answer '{question}', I examine the relevant part of the image and describe what it shows.",
    "The user wants to know: {question} The image content gives the answer without needing a tool.",
]

TOOL_SUBJECT = {
    "detect_all": "a complete list of the objects and their boxes",
    "sar_detect_all": "a complete list of the objects in this SAR image and their boxes",
    "detect_objects": "the number and positions of the {targets}",
    "segment_instances": "an individual outline of each of the {targets}",
    "ground": "the location of {expression}",
    "sar_ground": "the location of {expression}",
    "segment_referring": "the outline of {expression}",
    "segment_semantic": "the extent of {classes}",
    "extract_roads": "the road network as a graph",
    "remove_clouds": "a restored, cloud-free image",
}


UNCOUNTABLE = {"aircraft", "watercraft", "rotorcraft"}  # the plural is the word itself


def plural(label: str) -> str:
    if label.split(" ")[-1] in UNCOUNTABLE:
        return label
    if label.endswith(("s", "x", "ch", "sh")):
        return label + "es"
    if label.endswith("y") and label[-2:-1] not in "aeiou":
        return label[:-1] + "ies"
    return label + "s"


def join_words(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def names_for(label: str) -> list[str]:
    """The ways a query may name a class: the label itself and its class's everyday synonyms (vocabulary.yaml)."""
    canonical = default_vocabulary().lookup(label)
    return list(dict.fromkeys([label, *class_synonyms(canonical)])) if canonical is not None else [label]


def _in_words(canonical: str, rng: random.Random) -> str:
    """A class as a user would name it: the canonical name or one of its synonyms, at random."""
    return rng.choice(names_for(canonical))


def _reworded(expression: str, labels: list[str], rng: random.Random) -> str:
    """The expression with its class noun said another way, half of the time ("the lorry in the upper left")."""
    if rng.random() < 0.5:
        return expression
    for label in labels:
        forms = names_for(label)
        for form in sorted(forms, key=len, reverse=True):
            found = re.search(rf"\b{re.escape(form)}\b", expression)
            if found:
                return expression[: found.start()] + rng.choice(forms) + expression[found.end() :]
    return expression


def _slots(facts: dict, rng: random.Random | None = None) -> dict[str, str]:
    """Template slots. With `rng` (the user's query) classes are named in everyday words; without it (the plan's
    reasoning) in their canonical names, which is what the call's params carry."""
    params = facts.get("params", {})
    say = (lambda name: _in_words(name, rng)) if rng is not None else (lambda name: name)
    expression = params.get("expression", "the target")
    return {
        "modality": "SAR" if facts.get("modality") == "sar" else "optical",
        "targets": join_words([plural(say(c)) for c in params.get("categories", [])] or ["objects"]),
        "expression": _reworded(expression, facts.get("target_labels", []), rng) if rng is not None else expression,
        "classes": join_words([say(c) for c in params.get("classes", [])] or ["land cover"]),
        "tool": facts.get("tool", ""),
    }


def _box(box: list[float]) -> str:
    return "[" + ", ".join(f"{v:.3f}".rstrip("0").rstrip(".") if v not in (0, 1) else str(int(v)) for v in box) + "]"


def _counted(label: str, n: int) -> str:
    return f"{n} {label if n == 1 else plural(label)}"


def _describe_output(view: dict, facts: dict) -> tuple[str, str]:
    """(evidence phrase for the reasoning, answer text) from the tool turn's `llm_view`."""
    tool, params = facts["tool"], facts.get("params", {})
    objects = view.get("objects", [])
    if tool in {"ground", "sar_ground", "segment_referring"}:
        expression = params["expression"]
        if not objects:
            return "no match", f"I could not find {expression} in this image."
        boxes = ", ".join(_box(o["box"]) for o in objects[:5])
        if len(objects) == 1:
            area = f", covering {objects[0]['area'] * 100:.1f}% of the image" if "area" in objects[0] else ""
            return "one matching object", sentence(f"{expression} is at {boxes}{area}.")
        return f"{len(objects)} matching objects", sentence(f"{expression} matches {len(objects)} objects, at {boxes}.")
    if tool in {"detect_all", "sar_detect_all", "detect_objects", "segment_instances"}:
        if not objects:
            wanted = join_words([plural(c) for c in params.get("categories", [])] or ["objects"])
            return "no detections", f"I found no {wanted} in this image."
        counts: dict[str, int] = {}
        for o in objects:
            counts[o["label"]] = counts.get(o["label"], 0) + 1
        listed = join_words([_counted(label, n) for label, n in counts.items()])
        shown = objects[:4]
        boxes = "; ".join(f"{o['label']} at {_box(o['box'])}" for o in shown)
        more = " (the first few)" if len(objects) > len(shown) else ""
        return _counted("detection", len(objects)), f"I found {listed} in the image. Locations{more}: {boxes}."
    if tool == "segment_semantic":
        classes = view.get("classes", [])
        present = [c for c in classes if c["area"] > 0]
        absent = [c["label"] for c in classes if c["area"] == 0]
        parts = [f"{c['label']} covers {c['area'] * 100:.1f}% of the image" for c in present]
        text = "; ".join(parts) + "." if parts else ""
        if absent:
            text += f" There is no {join_words(absent)} in this scene."
        return "the area of each requested class", sentence(text.strip())
    if tool == "extract_roads":
        roads = view.get("roads", {"nodes": 0, "edges": 0, "intersections": 0, "length": 0})
        if not roads["edges"]:
            return "no roads", "I found no roads in this image."
        return (
            f"a graph of {_counted('node', roads['nodes'])}",
            f"The road network has {_counted('node', roads['nodes'])} joined by {_counted('segment', roads['edges'])}, with "
            f"{_counted('intersection', roads['intersections'])} and a total length of {roads['length']} image widths.",
        )
    if tool == "remove_clouds":
        if "image" in view.get("artifacts", []):
            return "a restored image", "I removed the clouds; the restored, cloud-free image is attached."
        return "no restored image", "The cloud removal did not produce an image."
    return "the result", view.get("message", "The tool ran on the image.")


class TemplateClient:
    """Writes each stage from its facts. `model` names the template set, so manifests say what wrote the text."""

    name = "template"
    model = "geopilot-templates-v1"
    concurrency = 16  # samples in flight: no I/O to wait on but the journal's grouped fsyncs

    async def complete(self, request: LLMRequest) -> tuple[str, CallInfo]:
        return json.dumps(self.reply(request.stage, request.facts, request.seed)), CallInfo()

    async def aclose(self) -> None:
        return None

    def reply(self, stage: str, facts: dict, seed: int) -> dict:
        rng = random.Random(seed)
        if stage == "plan":
            ability, difficulty = facts["ability"], facts["difficulty"]
            frame = (
                rng.choice(QUERIES[ability][difficulty]) if rng.random() < 0.3 else compose(ability, difficulty, rng)
            )
            query = frame.format(**_slots(facts, rng))
            subject = TOOL_SUBJECT[facts["tool"]].format(**_slots(facts))
            reasoning = rng.choice(PLAN_REASONING).format(subject=subject, tool=facts["tool"])
            return {
                "query": wrap(query, rng),
                "reasoning": reasoning,
                "actions": [{"tool": facts["tool"], "params": facts.get("params", {})}],
            }
        if stage == "answer":
            evidence, answer = _describe_output(facts["view"], facts)
            return {
                "reasoning": rng.choice(ANSWER_REASONING).format(tool=facts["tool"], evidence=evidence),
                "answer": answer,
            }
        if stage == "reasoning":
            questions = [text for role, text in facts["turns"] if role == "user"]
            return {"reasoning": [rng.choice(DIALOGUE_REASONING).format(question=_short(q)) for q in questions]}
        if stage == "caption_dialogue":
            return {"query": wrap(rng.choice(CAPTION_QUERIES), rng), "reasoning": rng.choice(CAPTION_REASONING)}
        raise ValueError(f"unknown stage {stage!r}")


def _short(question: str, limit: int = 120) -> str:
    text = " ".join(question.replace(IMAGE_PLACEHOLDER, "").split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."
