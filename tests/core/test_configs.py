"""Every YAML/JSON under configs/ loads through its typed config, a misspelt key in any of them is an error when it
loads, and every command takes overrides the same way: positional `key=value` words."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from geopilot.config import load_config, parse_command_line
from geopilot.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
FILES = sorted(p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*") if p.suffix in (".yaml", ".yml", ".json"))


def load_ablate_alpha(path: Path):
    from geopilot.config import load_config
    from geopilot.eval.ablate_alpha import AblateAlphaConfig

    cfg = load_config(AblateAlphaConfig, path)
    assert (ROOT / cfg.stage2_config).is_file(), cfg.stage2_config  # the stage-2 YAML it names is shipped
    return cfg


def load_training(path: Path):
    from geopilot.training.config import load_train_config

    cfg = load_train_config(path)
    if cfg.engine.deepspeed:  # the DeepSpeed JSON it names is shipped (paths are relative to the repo root)
        assert (ROOT / cfg.engine.deepspeed).is_file(), cfg.engine.deepspeed
    return cfg


def load_model(path: Path):
    from geopilot.model import ModelConfig

    return load_config(ModelConfig, path)


def load_data_gen(path: Path):
    from geopilot.data_gen.generate_config import GenerateConfig

    return load_config(GenerateConfig, path)


def load_tools(path: Path):
    from geopilot.tools.registry import backend_options, load_tools_config

    config = load_tools_config(path)
    for name, binding in config.tools.items():
        backend_options(name, binding)  # each binding's options through its backend's typed options model
    return config


def load_deepspeed(path: Path):
    """Through the training config that names it: `engine.deepspeed` -> resolve "auto" -> DeepSpeed's own config."""
    from geopilot.training.config import load_train_config
    from geopilot.training.stage_setup import deepspeed_settings

    cfg = load_train_config(
        CONFIGS / "tiny/stage1.yaml", [f"engine.deepspeed={path}", "optim.mixed_precision=bf16", "output_dir=x"]
    )
    return deepspeed_settings(cfg, world_size=1)


def loader_for(relative: str):
    """The typed config of a file under configs/ (a new kind of file must be added here)."""
    name = Path(relative).name
    if relative in ("tools.yaml", "tools_examples.yaml"):
        return load_tools
    if relative.startswith("deepspeed/") and name.endswith(".json"):
        return load_deepspeed
    if relative.startswith("model/"):
        return load_model
    if relative.startswith("data_gen/"):
        return load_data_gen
    if name.startswith("stage"):
        return load_training
    if name == "ablate_alpha.yaml":
        return load_ablate_alpha
    raise AssertionError(f"configs/{relative} has no typed config in tests/core/test_configs.py")


def test_the_catalogue_covers_every_kind():
    kinds = {loader_for(f).__name__ for f in FILES}
    assert kinds == {
        "load_tools",
        "load_deepspeed",
        "load_model",
        "load_data_gen",
        "load_training",
        "load_ablate_alpha",
    }


@pytest.mark.parametrize("relative", FILES)
def test_every_shipped_config_loads_through_its_typed_config(relative):
    assert loader_for(relative)(CONFIGS / relative) is not None


@pytest.mark.parametrize("relative", FILES)
def test_a_misspelt_key_fails_when_the_config_loads(relative, tmp_path):
    source = CONFIGS / relative
    copy = tmp_path / source.name
    if source.suffix == ".json":
        data = json.loads(source.read_text())
        data["zero_optimisation"] = {"stage": 2}
        copy.write_text(json.dumps(data))
    else:
        data = yaml.safe_load(source.read_text())
        data["optimiser"] = {"lr": 1.0}
        copy.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="zero_optimisation|optimiser"):
        loader_for(relative)(copy)


def test_detector_model_options_are_typed():
    from geopilot.tools.adapters import DetectorOptions, LaeDinoOptions
    from geopilot.tools.registry import load_tools_config

    config = load_tools_config(None, ["tools.detect_objects.options.model.box_threshold=0.1"])
    options = DetectorOptions.model_validate(config.tools["detect_objects"].options)
    assert isinstance(options.model, LaeDinoOptions) and options.model.box_threshold == 0.1
    with pytest.raises(ConfigError, match=r"tools\.detect_objects\.options: model\.box_treshold: unknown key"):
        load_tools_config(None, ["tools.detect_objects.options.model.box_treshold=0.1"])
    with pytest.raises(ConfigError, match=r"tools\.sar_ground\.options: model\.architecture"):
        load_tools_config(None, ["tools.sar_ground.options.model.architecture=swin-x"])


def _train_module():
    spec = importlib.util.spec_from_file_location("train_entry", ROOT / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _command_parser(name: str) -> argparse.ArgumentParser:
    from geopilot.cli import walk

    holder = next(holder for prog, _, holder in walk() if prog == f"geopilot {name}")
    parser = argparse.ArgumentParser(prog=f"geopilot {name}", exit_on_error=False)
    holder.add_arguments(parser)
    return parser


# (command, argv with overrides both before and after later options) for every command that reads a config
COMMAND_LINES = {
    "init-model": ["--config", "c.yaml", "a.b=1", "--out", "o", "c=[x, y]", "--json"],
    "generate": ["--config", "c.yaml", "a.b=1", "--out", "o", "c=[x, y]", "--quiet"],
    "tools run": ["detect_objects", "a.b=1", "--image", "i.png", "c=[x, y]", "--json"],
    "mcp": ["--transport", "stdio", "a.b=1", "--config", "t.yaml", "c=[x, y]"],
}


@pytest.mark.parametrize("name", sorted(COMMAND_LINES))
def test_one_override_syntax_for_every_command(name):
    args = parse_command_line(_command_parser(name), COMMAND_LINES[name])
    assert args.overrides == ["a.b=1", "c=[x, y]"]


def test_train_and_tools_list_take_the_same_overrides():
    train = _train_module()
    args = train.parse_args(["a.b=1", "--config", "c.yaml", "c=[x, y]"])
    assert (args.config, args.overrides) == ("c.yaml", ["a.b=1", "c=[x, y]"])
    args = parse_command_line(_command_parser("tools list"), ["--json", "device=cpu"])
    assert (args.json, args.overrides) == (True, ["device=cpu"])


def test_set_flag_and_stray_words_are_usage_errors(capsys, tmp_path):
    from geopilot.cli import main

    assert main(["tools", "list", "--set", "device=cpu"]) == 2
    assert "no --set" in capsys.readouterr().err
    assert main(["init-model", "--config", str(CONFIGS / "model/tiny.yaml"), "--out", str(tmp_path), "stray"]) == 2
    assert "'stray' is not of the form key=value" in capsys.readouterr().err
    assert main(["tools", "run", "detect_objects", "--image", "i.png", "stray"]) == 2
    assert "unrecognized arguments: stray" in capsys.readouterr().err
    assert main(["tools", "list", "--jsn"]) == 2
    assert "unrecognized arguments: --jsn" in capsys.readouterr().err
