"""What `geopilot generate` reads: the sources and the run's settings (configs/data_gen/*.yaml), and the part of
them that decides the samples (`content_settings`, the run folder's identity in geopilot.data_gen.shards)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from geopilot.config import StrictConfig
from geopilot.data_gen.abilities import ABILITIES
from geopilot.data_gen.chains import ChainsConfig
from geopilot.data_gen.llm import LLMClientConfig
from geopilot.fileio import fingerprint


class SourceConfig(StrictConfig):
    reader: str  # a key of geopilot.data_gen.readers.READERS, e.g. "dota"
    root: Path  # the dataset's root folder
    limit: int | None = Field(default=None, ge=1)  # use at most this many records (the first by record id)
    abilities: list[str] | None = None  # restrict this source to these abilities (default: the run's list)
    options: dict[str, Any] = {}  # keyword arguments of the reader, e.g. {split: train}
    max_skip_fraction: float | None = Field(default=None, ge=0, le=1)  # this source's own limit (default: the run's)


class GenerateConfig(StrictConfig):
    sources: list[SourceConfig] = Field(min_length=1)
    abilities: list[str] = Field(default_factory=lambda: list(ABILITIES))
    samples_per_record: int = Field(default=1, ge=1)  # tool samples per (record, ability)
    backend: LLMClientConfig = LLMClientConfig()  # the LLM client (the key keeps its released name)
    seed: int = 0
    shard_size: int = Field(default=1000, ge=1)
    max_regenerations: int = Field(default=3, ge=0)  # per stage; then the sample is dropped with its reason
    # a source skipping more than this fraction of its items is an error (geopilot.data_gen.sources)
    max_skip_fraction: float = Field(default=0.2, ge=0, le=1)
    chains: ChainsConfig = ChainsConfig()  # two-step tool chains, a share of each stage (geopilot.data_gen.chains)

    @model_validator(mode="after")
    def _known_abilities(self) -> GenerateConfig:
        unknown = sorted(
            {a for a in self.abilities + [a for s in self.sources for a in s.abilities or []] if a not in ABILITIES}
        )
        if unknown:
            raise ValueError(f"unknown abilities {unknown}; choose from {', '.join(ABILITIES)}")
        return self

    def content_settings(self) -> dict:
        """What decides the samples: everything but where and how fast they are fetched (the model counts)."""
        data = self.model_dump(mode="json")
        for key in LLMClientConfig.run_only_keys():
            data["backend"].pop(key)
        data.pop("max_skip_fraction")  # gates a run, never changes a sample
        if not self.chains.share:  # runs without chains keep the hash they had before chains existed
            data.pop("chains")
        for source in data["sources"]:
            source.pop("max_skip_fraction")
        return data

    def content_hash(self) -> str:
        return fingerprint(self.content_settings())
