"""Sample builders covering every kind of sample the format allows (used by several foundation tests): each kind is
one_tool_call() with its differences."""

from __future__ import annotations

import copy

DETECTION = {"detections": [{"label": "plane", "box": [0.1, 0.2, 0.3, 0.4], "score": 0.91}]}


def user(content: str) -> dict:
    return {"role": "user", "content": content}


def assistant(reasoning: str, value: str | None = None, actions: tuple[dict, ...] = ()) -> dict:
    """A plan turn (`actions`, no value) or an answer turn (`value`, no actions)."""
    return {"role": "assistant", "reasoning": reasoning, "actions": list(actions), "value": value}


def tool(name: str, content: dict) -> dict:
    return {"role": "tool", "name": name, "content": content}


def one_tool_call() -> dict:
    return {
        "id": "dota/P0001/object_detection/0",
        "image": "images/P0001.png",
        "modality": "optical",
        "source": "DOTA",
        "ability": "object_detection",
        "difficulty": "easy",
        "messages": [
            user("<image>\nHow many planes are parked on the apron?"),
            assistant(
                "Counting planes needs a detector.",
                actions=({"tool": "detect_objects", "params": {"categories": ["plane"]}},),
            ),
            tool("detect_objects", copy.deepcopy(DETECTION)),
            assistant("The detector found one plane.", "There is 1 plane."),
        ],
    }


def tool_free() -> dict:
    sample = one_tool_call()
    del sample["difficulty"]  # optional: this one leaves it out
    sample.update(id="geochat/1/vqa/0", image="images/scene.png", source="GeoChat-Instruct", ability="vqa")
    sample["messages"] = [
        user("<image>\nIs there a harbor in this image?"),
        assistant("A harbor with piers is visible.", "Yes."),
    ]
    return sample


def multi_turn() -> dict:
    sample = one_tool_call()
    sample["id"] = "dota/P0001/object_detection/multi"
    sample["messages"] = [
        user("<image>\nWhat kind of scene is this?"),
        assistant("Runways and aprons.", "An airport."),
        user("How many planes are there?"),
        *sample["messages"][1:],
    ]
    return sample


def two_tools() -> dict:
    sample = one_tool_call()
    sample["id"] = "dota/P0001/object_detection/two"
    sample["messages"][1]["actions"].append({"tool": "segment_semantic", "params": {"classes": ["water"]}})
    sample["messages"].insert(3, tool("segment_semantic", {"segments": [{"label": "water", "area": 0.25}]}))
    return sample


def sar() -> dict:
    sample = one_tool_call()
    sample.update(id="sardet/0001/sar_detection/0", image="images/sar.png", modality="sar", source="SARDet-100K")
    sample.update(ability="sar_detection", difficulty="hard")
    sample["messages"] = [
        user("<image>\nFind all ships in this SAR image."),
        assistant("SAR detector.", actions=({"tool": "sar_detect_all", "params": {}},)),
        tool("sar_detect_all", {"detections": [{"label": "ship", "box": [0.5, 0.5, 0.6, 0.55]}]}),
        assistant("One ship.", "One ship at [0.5, 0.5, 0.6, 0.55]."),
    ]
    return sample


def special_text() -> dict:
    """Unicode, JSON-special characters, and strings that look like special tokens (they must stay text)."""
    sample = one_tool_call()
    sample["id"] = "special/ü/0"
    sample["messages"][0]["content"] = (
        '<image>\nCombien d\'avions « 飞机 » ? {"x": [1, 2]} \\n \t </s> USER: ASSISTANT: 🛩️'
    )
    sample["messages"][3]["value"] = 'Réponse: "1" avion — ✈ \\ } { </s>'
    return sample


def unicode_text() -> dict:
    """Non-ASCII and JSON-special text everywhere the model reads it (question, params, tool labels, answer), but
    no special-token strings: the chat template must then give the renderer's ids exactly."""
    sample = one_tool_call()
    sample["id"] = "unicode/飞机/0"
    sample["messages"][0]["content"] = '<image>\nCombien d\'avions « 飞机 » sont garés ? {"x": [1, 2]} \\n \t 🛩️ ½ naïve'
    sample["messages"][1]["actions"][0]["params"] = {"categories": ["飞机", "avión"]}
    sample["messages"][2]["content"]["detections"][0]["label"] = "飞机"
    sample["messages"][3]["value"] = 'Réponse : « 1 » avion ✈, "quoted" \\ ok'
    return sample


ALL_KINDS = {
    "tool_free": tool_free,
    "one_tool_call": one_tool_call,
    "multi_turn": multi_turn,
    "two_tools": two_tools,
    "sar": sar,
    "special_text": special_text,
    "unicode": unicode_text,
}
