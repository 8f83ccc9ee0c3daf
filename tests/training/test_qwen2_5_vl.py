"""The whole recipe on Qwen2.5-VL (configs/tiny/qwen2_5_vl/): stage 1 then stage 2 (alpha replay) on the tiny random
model, the export reloaded with plain transformers, a chat answered through the agent loop with KV reuse."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image
from train_helpers import ROOT, TINY
from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

import train
from geopilot.agent import GeoPilot
from geopilot.families import qwen2_5_vl
from geopilot.model import load_model

CONFIGS = ROOT / "configs/tiny/qwen2_5_vl"


def _args(stage: int, data, out, *extra: str) -> list[str]:
    return [
        "--config",
        str(CONFIGS / f"stage{stage}.yaml"),
        f"output_dir={out}",
        f"data.files=[{data}]",
        f"data.cache_dir={out.parent / 'cache'}",
        "optim.max_steps=2",
        *TINY,
        *extra,
    ]


@pytest.mark.slow
def test_qwen_stage1_then_stage2_export_reloads_and_chats(dataset, tmp_path):
    assert train.main(_args(1, dataset, tmp_path / "s1")) == 0
    export1 = tmp_path / "s1" / "export"
    assert json.loads((export1 / "geopilot_train.json").read_text())["data"]["trained"]["by_modality"] == {
        "optical": 24
    }
    assert train.main(_args(2, dataset, tmp_path / "s2", f"model.path={export1}")) == 0
    export2 = tmp_path / "s2" / "export"
    mixture = json.loads((export2 / "geopilot_train.json").read_text())["data"]["mixture"]
    assert mixture["selected"] == {"optical": 5, "sar": 12}

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(export2)  # plain transformers, no geopilot code
    processor = AutoProcessor.from_pretrained(export2)
    assert processor.chat_template == qwen2_5_vl.CHAT_TEMPLATE
    assert processor.image_processor.size["longest_edge"] == 448 * 448  # the stage-1 config's max_pixels, kept
    before = Qwen2_5_VLForConditionalGeneration.from_pretrained(export1)
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before.state_dict()[n])]
    assert changed and not any(n.startswith(("model.visual.blocks.", "model.visual.patch_embed.")) for n in changed)

    pilot = GeoPilot(*load_model(export2))
    image = Image.open(next(dataset.parent.rglob("*.png"))).convert("RGB")
    result = pilot.chat(image, "How many planes are there?", generation={"max_new_tokens": 32})
    assert result.messages[0].content.endswith("How many planes are there?")
    assert result.outcome in {"direct", "tools", "unparsable", "round_limit"}  # 4 steps of a random model
    assert result.messages[-1].role == "assistant" and result.turns[0].kind == "think"
