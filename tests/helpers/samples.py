"""Sample builders covering every kind of sample the format allows (used by several foundation tests)."""

from __future__ import annotations

import copy

DETECTION = {"detections": [{"label": "plane", "box": [0.1, 0.2, 0.3, 0.4], "score": 0.91}]}


def tool_free() -> dict:
    return {
        "id": "geochat/1/vqa/0",
        "image": "images/scene.png",
        "modality": "optical",
        "source": "GeoChat-Instruct",
        "ability": "vqa",
        "messages": [
            {"role": "user", "content": "<image>\nIs there a harbor in this image?"},
            {"role": "assistant", "reasoning": "A harbor with piers is visible.", "actions": [], "value": "Yes."},
        ],
    }


def one_tool_call() -> dict:
    return {
        "id": "dota/P0001/object_detection/0",
        "image": "images/P0001.png",
        "modality": "optical",
        "source": "DOTA",
        "ability": "object_detection",
        "difficulty": "easy",
        "messages": [
            {"role": "user", "content": "<image>\nHow many planes are parked on the apron?"},
            {
                "role": "assistant",
                "reasoning": "Counting planes needs a detector.",
                "actions": [{"tool": "detect_objects", "params": {"categories": ["plane"]}}],
                "value": None,
            },
            {"role": "tool", "name": "detect_objects", "content": copy.deepcopy(DETECTION)},
            {
                "role": "assistant",
                "reasoning": "The detector found one plane.",
                "actions": [],
                "value": "There is 1 plane.",
            },
        ],
    }


def multi_turn() -> dict:
    sample = one_tool_call()
    sample["id"] = "dota/P0001/object_detection/multi"
    sample["messages"] = [
        {"role": "user", "content": "<image>\nWhat kind of scene is this?"},
        {"role": "assistant", "reasoning": "Runways and aprons.", "actions": [], "value": "An airport."},
        {"role": "user", "content": "How many planes are there?"},
        *sample["messages"][1:],
    ]
    return sample


def two_tools() -> dict:
    sample = one_tool_call()
    sample["id"] = "dota/P0001/object_detection/two"
    sample["messages"][1]["actions"].append({"tool": "segment_semantic", "params": {"classes": ["water"]}})
    sample["messages"].insert(
        3, {"role": "tool", "name": "segment_semantic", "content": {"segments": [{"label": "water", "area": 0.25}]}}
    )
    return sample


def sar() -> dict:
    return {
        "id": "sardet/0001/sar_detection/0",
        "image": "images/sar.png",
        "modality": "sar",
        "source": "SARDet-100K",
        "ability": "sar_detection",
        "difficulty": "hard",
        "messages": [
            {"role": "user", "content": "<image>\nFind all ships in this SAR image."},
            {
                "role": "assistant",
                "reasoning": "SAR detector.",
                "actions": [{"tool": "sar_detect_all", "params": {}}],
                "value": None,
            },
            {
                "role": "tool",
                "name": "sar_detect_all",
                "content": {"detections": [{"label": "ship", "box": [0.5, 0.5, 0.6, 0.55]}]},
            },
            {
                "role": "assistant",
                "reasoning": "One ship.",
                "actions": [],
                "value": "One ship at [0.5, 0.5, 0.6, 0.55].",
            },
        ],
    }


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
