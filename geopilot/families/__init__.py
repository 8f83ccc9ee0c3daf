"""Model families (docs/models.md): one small module each, the only code that knows a model's layout.

A family module supplies NAME, MODEL_TYPE (config.json's `model_type`) and PROCESSOR_CLASS, `build(ModelConfig)` and
`load(path, dtype)` -> (model, processor), `text_hidden_size`, `image_token_count(processor, width, height)`,
`image_inputs`, `sample_image_tokens` and `vision_kwargs` (what training and
generation feed the model), `CHAT_TEMPLATE` (the template it was pretrained with), `hf_messages` and `render_sample` (the training renderer,
equal to that template token for token, labels on the assistant turns only), `LORA_TARGET_MODULES` and
`MODULES_TO_SAVE`, its box convention (`BOX_CONVENTION`, `box_to_model`, `box_from_model`, `box_codec`,
`sample_boxes`, `BOX_SCHEMA`: `geopilot.boxes`), and what it is (`NATIVE_RESOLUTION`: `min_pixels`/`max_pixels`
apply; `STEPPABLE`: the per-step scheduler can drive it, with `step_positions`; `PROMPT_LOOKUP`).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from geopilot.errors import WeightsError
from geopilot.families import llava, qwen2_5_vl

FAMILIES: dict[str, ModuleType] = {llava.NAME: llava, qwen2_5_vl.NAME: qwen2_5_vl}


def get_family(name: str) -> ModuleType:
    if name not in FAMILIES:
        raise WeightsError(f"unknown model family {name!r}: supported are {', '.join(FAMILIES)}")
    return FAMILIES[name]


def family_of_model(model) -> ModuleType:
    """The family of a loaded transformers model, by its config's `model_type`."""
    return _by_model_type(model.config.model_type, "the model")


def family_of_processor(processor) -> ModuleType:
    """The family of a processor, by its class (a saved processor names it in processor_config.json)."""
    for family in FAMILIES.values():
        if type(processor).__name__ == family.PROCESSOR_CLASS:
            return family
    raise WeightsError(f"processor {type(processor).__name__} belongs to no supported family ({', '.join(FAMILIES)})")


def family_of_dir(path: str | Path) -> ModuleType:
    """The family of a saved model directory, read from its config.json (no weights are read)."""
    config = Path(path) / "config.json"
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError) as err:
        raise WeightsError(f"{config}: not a readable model config ({type(err).__name__})") from None
    return _by_model_type(model_type, str(path))


def _by_model_type(model_type, where: str) -> ModuleType:
    for family in FAMILIES.values():
        if family.MODEL_TYPE == model_type:
            return family
    supported = ", ".join(f"{f.MODEL_TYPE} ({name})" for name, f in FAMILIES.items())
    raise WeightsError(f"{where}: model_type {model_type!r} is not a supported family; supported: {supported}")
