"""Tokenizers: prepare a real Llama/Vicuna tokenizer for segment-wise rendering, or build a tiny one for tests.

Segment-wise rendering (geopilot.render) needs a tokenizer that does not put a `▁` at the start of every
separately tokenised piece (the SentencePiece "prefix space"): with a Metaspace pre-tokenizer that is
`prepend_scheme="never"`, which `LlamaTokenizer.from_pretrained(dir, legacy=False, add_prefix_space=False)` gives.
`check_segment_safe` proves it on the live tokenizer instead of trusting flags.
"""

from __future__ import annotations

from pathlib import Path

from geopilot.chat_template import current_template
from geopilot.errors import ConfigError
from geopilot.sample import IMAGE_PLACEHOLDER

IMAGE_TOKEN = IMAGE_PLACEHOLDER  # the tokenizer adds the sample format's placeholder as one special token
PAD_TOKEN = "<pad>"
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2 as in Llama/Vicuna


def load_tokenizer(path: str | Path):
    """A local tokenizer directory -> a segment-safe tokenizer with `<image>` and `<pad>` added."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"tokenizer directory not found: {path}")
    if (path / "tokenizer.model").is_file() and not (path / "tokenizer_config.json").is_file():
        # A bare SentencePiece model: AutoTokenizer would give a generic backend that strips the first space on decode.
        from transformers import LlamaTokenizer

        tokenizer = LlamaTokenizer.from_pretrained(path, legacy=False, add_prefix_space=False)
    else:
        tokenizer = AutoTokenizer.from_pretrained(path, legacy=False, add_prefix_space=False)
    return prepare_tokenizer(tokenizer)


def prepare_tokenizer(tokenizer, chat_template: str | None = None):
    """Add the image and pad tokens (as special, so text never produces them), set the wire format's chat
    template (what an export saves for transformers and vLLM; `chat_template`, else the current version of the
    GeoPilot template the tokenizer carries, else Vicuna's) and verify segment safety."""
    missing = [t for t in (IMAGE_TOKEN,) if t not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing})
    if tokenizer.pad_token is None:
        tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
    tokenizer.padding_side = "right"
    tokenizer.chat_template = chat_template or current_template(tokenizer.chat_template)
    check_segment_safe(tokenizer)
    return tokenizer


def encode_text(tokenizer, text: str) -> list[int]:
    """Plain text -> ids. Special-token strings inside text stay text: a user cannot inject `</s>` or `<image>`."""
    if not text:
        return []
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def check_segment_safe(tokenizer) -> None:
    probe = ["USER: How many planes?", " ASSISTANT:", ' {"value":"7"}']
    whole = encode_text(tokenizer, "".join(probe))
    pieces = [i for part in probe for i in encode_text(tokenizer, part)]
    if whole != pieces:
        raise ConfigError(
            "tokenizer adds a prefix space to each segment, so loss masks would not match the text; "
            "load it with legacy=False, add_prefix_space=False (Metaspace prepend_scheme='never')"
        )


def tiny_corpus() -> list[str]:
    from geopilot.wire import SYSTEM_PROMPT

    words = (
        "the a an of in on at to and or is are there how many what where which find detect count segment road "
        "roads cloud clouds plane planes ship ships vehicle vehicles car cars building buildings harbor bridge tank "
        "storage airport runway water tree trees field image scene optical sar radar object objects box boxes area "
        "answer question tool output reasoning actions value params categories classes expression label score count "
        "detect_objects detect_all ground segment_semantic segment_instances segment_referring extract_roads "
        "remove_clouds sar_detect_all sar_ground yes no left right top bottom center large small near far red white "
        "0 1 2 3 4 5 6 7 8 9 0.1 0.25 0.5 0.75 I will use it to help answer my first question please "
        "USER ASSISTANT How What Where Which Is Are Count Find Detect Segment There The"
    ).split()
    return [
        SYSTEM_PROMPT,
        "USER: ASSISTANT: </s>",
        '{"reasoning":"","actions":[{"tool":"","params":{}}],"value":null}',
    ] + [" ".join(words[i : i + 12]) for i in range(0, len(words), 7)]


def tiny_tokenizer(vocab_size: int = 1024, corpus: list[str] | None = None):
    """A small byte-fallback BPE in the Llama layout, trained in-process (deterministic). For tests and tiny models;
    `corpus` (default: a fixed word list + the wire format) lets a small model get a vocabulary of its own data."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaTokenizer

    byte_pieces = [f"<0x{b:02X}>" for b in range(256)]
    bpe = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS + byte_pieces, show_progress=False
    )
    bpe.train_from_iterator(tiny_corpus() + list(corpus or []), trainer=trainer)
    merges = [tuple(pair) for pair in json.loads(bpe.to_str())["model"]["merges"]]  # LlamaTokenizer wants tuples
    tokenizer = LlamaTokenizer(
        vocab=bpe.get_vocab(),
        merges=merges,
        legacy=False,
        add_prefix_space=False,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
    )
    return prepare_tokenizer(tokenizer)
