"""The one class vocabulary: canonical class names, each dataset's own names for them, and SegEarth-OV's prompts.

The data live in `geopilot/vocabulary.yaml` (shipped with the package). Readers write canonical names into records
(DIOR `storagetank`, DOTA `storage-tank` and iSAID `storage_tank` all become `storage tank`), so training tool turns,
tool prompts (`detect_all`'s vocabulary, LAE-DINO categories, SegEarth-OV classes), the annotation backend and
evaluation speak one language:

    canonical_class("baseballfield", "DIOR")      -> "baseball field"
    canonical_class("Small_Vehicle")              -> "small vehicle"   (any dataset's name, case/-/_ insensitive)
    canonical_class("planes")                     -> "airplane"        (a trailing plural is tolerated)
    canonical_class("pier")                       -> "pier"            (unknown: returned verbatim; is_known_class False)
    dataset_classes("DOTA v1.5")                  -> ["airplane", "baseball field", ..., "container crane"]
    labels_match("small vehicle", "car", allow_parent=True) -> True
    segearth_queries(["rangeland", "building"], "OpenEarthMap") -> ["grass", "building,roof,house"]
    class_synonyms("large vehicle")               -> ["truck", "lorry", "heavy vehicle", "heavy goods vehicle"]
    prompt_name("storage tank", "remotesam")      -> "storagetank"     (upstream's raw dataset name)

Lookup of a raw name: the dataset's own names first (when a dataset is given), then every name any dataset uses
(and the canonical names), compared lower-case with '-' and '_' as spaces; then with spaces removed; then without a
trailing "s"/"es". Synonyms (everyday names such as "lorry" for `large vehicle`) are for writing queries and are never
used by lookups. A name in no vocabulary is never dropped: it is returned verbatim and `is_known_class` says False
(the generation report counts such names). The file is checked when loaded: every name it maps to is a canonical
class, parents form a tree, no spelling means two different classes, and a synonym belongs to one class and names
no other class than that one, a parent or a subclass of it.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from pathlib import Path

import yaml
from pydantic import Field, model_validator

from geopilot.config import StrictConfig, build_config
from geopilot.errors import ConfigError, GeoPilotInputError


class DatasetEntry(StrictConfig):
    names: list[str] = []  # other spellings of the dataset's name (reader keys, record `source`)
    includes: list[str] = []  # datasets whose classes come first (DOTA v1.5 includes DOTA v1.0)
    classes: dict[str, str] = {}  # the dataset's own class name -> canonical name, in the dataset's class order
    aliases: dict[str, str] = {}  # other spellings seen in the dataset's files or code -> canonical name


class SegEarthEntry(StrictConfig):
    prob_threshold: float = Field(ge=0.0, le=1.0)  # upstream cfg_<dataset>.py `prob_thd`
    prompts: dict[str, str]  # canonical class -> the line of upstream's cls_<dataset>.txt (comma = synonyms)


class VocabularyFile(StrictConfig):
    classes: dict[str, str | None]  # canonical name -> parent (None = top level)
    datasets: dict[str, DatasetEntry]
    segearth_ov: dict[str, SegEarthEntry] = {}
    synonyms: dict[str, list[str]] = {}  # canonical name -> everyday names (singular), for writing queries
    # backend -> upstream dataset -> canonical name -> the raw name upstream prompts with
    prompt_names: dict[str, dict[str, dict[str, str]]] = {}

    @model_validator(mode="after")
    def _consistent(self) -> VocabularyFile:
        for name, parent in self.classes.items():
            if name != normalise(name):
                raise ValueError(f"canonical name {name!r} must be lower-case words (as {normalise(name)!r})")
            if parent is not None and parent not in self.classes:
                raise ValueError(f"class {name!r}: parent {parent!r} is not a canonical class")
        for name in self.classes:
            seen = {name}
            parent = self.classes[name]
            while parent is not None:
                if parent in seen:
                    raise ValueError(f"class {name!r}: its parents form a cycle")
                seen.add(parent)
                parent = self.classes[parent]
        for dataset, entry in self.datasets.items():
            for included in entry.includes:
                if included not in self.datasets:
                    raise ValueError(f"dataset {dataset!r} includes unknown dataset {included!r}")
            for raw, canonical in {**entry.classes, **entry.aliases}.items():
                if canonical not in self.classes:
                    raise ValueError(f"dataset {dataset!r}: {raw!r} maps to {canonical!r}, not a canonical class")
        for dataset, entry in self.segearth_ov.items():
            for canonical in entry.prompts:
                if canonical not in self.classes:
                    raise ValueError(f"segearth_ov.{dataset}: {canonical!r} is not a canonical class")
        for backend, tables in self.prompt_names.items():
            for dataset, table in tables.items():
                for canonical in table:
                    if canonical not in self.classes:
                        raise ValueError(f"prompt_names.{backend}.{dataset}: {canonical!r} is not a canonical class")
        owner: dict[str, str] = {}
        for canonical, words in self.synonyms.items():
            if canonical not in self.classes:
                raise ValueError(f"synonyms: {canonical!r} is not a canonical class")
            for word in words:
                key = normalise(word)
                if not key or key == canonical:
                    raise ValueError(f"synonyms.{canonical}: {word!r} is empty or the class's own name")
                if owner.get(key, canonical) != canonical:
                    raise ValueError(f"synonyms: {word!r} is listed for {owner[key]!r} and {canonical!r}")
                owner[key] = canonical
        return self


def normalise(raw: str) -> str:
    """Lower case, '-' and '_' as spaces, single spaces: "Small_Vehicle" -> "small vehicle"."""
    return " ".join(raw.replace("-", " ").replace("_", " ").lower().split())


def _dataset_key(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", name.lower())


def _singulars(key: str) -> list[str]:
    if len(key) <= 3 or not key.endswith("s") or key.endswith("ss"):
        return []
    return [key[:-1], key[:-2]] if key.endswith("es") else [key[:-1]]


class Vocabulary:
    """The loaded vocabulary file with its lookup tables. Use the module functions for the shipped file."""

    def __init__(self, data: VocabularyFile):
        self.data = data
        self.parents = dict(data.classes)
        self._datasets = {}  # dataset key -> dataset name
        for name, entry in data.datasets.items():
            for spelling in (name, *entry.names):
                key = _dataset_key(spelling)
                if self._datasets.get(key, name) != name:
                    raise ConfigError(f"vocabulary: dataset name {spelling!r} names two datasets")
                self._datasets[key] = name
        self._segearth = {_dataset_key(n): n for n in data.segearth_ov}
        self._own: dict[str, dict[str, str]] = {}  # dataset name -> its normalised spellings -> canonical
        self._global: dict[str, str] = {}  # normalised spelling -> canonical
        self._squashed: dict[str, str] = {}  # the same without spaces ("storagetank")
        for canonical in data.classes:
            self._add_global(canonical, canonical, "canonical names")
        for dataset, entry in data.datasets.items():
            for raw, canonical in {**entry.classes, **entry.aliases}.items():
                self._add_global(raw, canonical, dataset)
        for canonical, words in data.synonyms.items():
            for word in words:
                named = self.lookup(word)
                if (
                    named is not None
                    and named not in {canonical, *self.ancestors(canonical)}
                    and (canonical not in self.ancestors(named))
                ):
                    raise ConfigError(
                        f"vocabulary: synonym {word!r} of {canonical!r} is a name of the unrelated class {named!r}"
                    )

    def _add_global(self, raw: str, canonical: str, where: str) -> None:
        for table, key in ((self._global, normalise(raw)), (self._squashed, normalise(raw).replace(" ", ""))):
            if table.get(key, canonical) != canonical:
                raise ConfigError(
                    f"vocabulary: {raw!r} ({where}) means {canonical!r} but elsewhere {table[key]!r}; "
                    "a spelling must mean one class"
                )
            table[key] = canonical

    # -- datasets -----------------------------------------------------------------------------------------------
    def dataset_name(self, dataset: str) -> str:
        name = self._datasets.get(_dataset_key(dataset))
        if name is None:
            raise GeoPilotInputError(
                f"unknown dataset {dataset!r} in the class vocabulary; known: {', '.join(self.data.datasets)}"
            )
        return name

    def _raw_table(self, name: str) -> dict[str, str]:
        entry = self.data.datasets[name]
        table: dict[str, str] = {}
        for included in entry.includes:
            table.update(self._raw_table(included))
        table.update(entry.classes)
        table.update(entry.aliases)
        return table

    def _class_order(self, name: str) -> list[str]:
        entry = self.data.datasets[name]
        order = [c for included in entry.includes for c in self._class_order(included)]
        return list(dict.fromkeys([*order, *entry.classes.values()]))

    def dataset_classes(self, dataset: str) -> list[str]:
        return self._class_order(self.dataset_name(dataset))

    # -- names ----------------------------------------------------------------------------------------------------
    def lookup(self, raw: str, dataset: str | None = None) -> str | None:
        """The canonical name of `raw`, or None when no vocabulary knows it."""
        if not isinstance(raw, str) or not raw.strip():
            raise GeoPilotInputError(f"a class name must be a non-empty string, got {raw!r}")
        key = normalise(raw)
        if dataset is not None:
            name = self.dataset_name(dataset)
            if name not in self._own:
                self._own[name] = {normalise(k): v for k, v in self._raw_table(name).items()}
            own = self._own[name]
            if key in own:
                return own[key]
        for candidate in (key, *_singulars(key)):
            if candidate in self._global:
                return self._global[candidate]
            if candidate.replace(" ", "") in self._squashed:
                return self._squashed[candidate.replace(" ", "")]
        return None

    def canonical_class(self, raw: str, dataset: str | None = None) -> str:
        found = self.lookup(raw, dataset)
        return raw if found is None else found

    def ancestors(self, canonical: str) -> list[str]:
        out, parent = [], self.parents.get(canonical)
        while parent is not None:
            out.append(parent)
            parent = self.parents[parent]
        return out

    def labels_match(
        self, predicted: str, ground_truth: str, dataset: str | None = None, *, allow_parent: bool = False
    ) -> bool:
        pred, truth = self.lookup(predicted), self.lookup(ground_truth, dataset)
        pred = pred if pred is not None else normalise(predicted)
        truth = truth if truth is not None else normalise(ground_truth)
        return pred == truth or (allow_parent and pred in self.ancestors(truth))

    def synonyms(self, canonical: str) -> list[str]:
        """The everyday names of a canonical class (may be empty); GeoPilotInputError for a name that is not one."""
        if canonical not in self.parents:
            raise GeoPilotInputError(f"{canonical!r} is not a canonical class name")
        return list(self.data.synonyms.get(canonical, []))

    # -- SegEarth-OV ------------------------------------------------------------------------------------------------
    def segearth_entry(self, dataset: str) -> SegEarthEntry:
        key = _dataset_key(dataset)
        name = self._segearth.get(key) or self._segearth.get(_dataset_key(self._datasets.get(key, "")))
        if name is None:
            raise GeoPilotInputError(
                f"no SegEarth-OV class file for {dataset!r}; known: {', '.join(self.data.segearth_ov)}"
            )
        return self.data.segearth_ov[name]

    def segearth_queries(self, classes: list[str], dataset: str | None) -> list[str]:
        """Each class as SegEarth-OV's prompt: the dataset's class file, then any other, else the name as given."""
        tables = [self.segearth_entry(dataset).prompts] if dataset is not None else []
        tables += [entry.prompts for entry in self.data.segearth_ov.values()]
        out = []
        for name in classes:
            canonical = self.lookup(name, None)
            prompt = next((t[canonical] for t in tables if canonical in t), None) if canonical else None
            out.append(prompt if prompt is not None else name)
        return out

    # -- backend prompts --------------------------------------------------------------------------------------------
    def prompt_name(self, name: str, backend: str) -> str:
        """The wording `backend`'s upstream prompts a class with (its dataset's raw name), else the canonical name."""
        canonical = self.canonical_class(name)
        for table in self.data.prompt_names.get(backend, {}).values():
            if canonical in table:
                return table[canonical]
        return canonical


def load_vocabulary(path: str | Path) -> Vocabulary:
    """A vocabulary file (same layout as the shipped one); ConfigError when it is inconsistent."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read the class vocabulary {path}: {err}") from None
    return Vocabulary(build_config(VocabularyFile, raw, f"vocabulary {path}"))


@cache
def default_vocabulary() -> Vocabulary:
    """The shipped `geopilot/vocabulary.yaml`, loaded once on first use."""
    return load_vocabulary(Path(str(resources.files("geopilot") / "vocabulary.yaml")))


def canonical_class(raw: str, dataset: str | None = None) -> str:
    """The canonical name of a class name; a name in no vocabulary comes back verbatim."""
    return default_vocabulary().canonical_class(raw, dataset)


def is_known_class(raw: str, dataset: str | None = None) -> bool:
    return default_vocabulary().lookup(raw, dataset) is not None


def dataset_classes(dataset: str) -> list[str]:
    """The dataset's classes as canonical names, in its class order (DOTA v1.5 = v1.0's 15 + container crane)."""
    return default_vocabulary().dataset_classes(dataset)


def labels_match(predicted: str, ground_truth: str, dataset: str | None = None, *, allow_parent: bool = False) -> bool:
    """For evaluation: does a predicted label name the ground-truth class? Both go through the vocabulary (the
    ground truth also through `dataset`'s own names); unknown names compare normalised. With `allow_parent`, a
    coarser prediction matches a finer truth ("vehicle" matches FAIR1M "Small Car")."""
    return default_vocabulary().labels_match(predicted, ground_truth, dataset, allow_parent=allow_parent)


def class_synonyms(canonical: str) -> list[str]:
    """Everyday names of a canonical class ("large vehicle" -> truck, lorry, ...), for writing varied queries."""
    return default_vocabulary().synonyms(canonical)


def segearth_queries(classes: list[str], dataset: str | None = "OpenEarthMap") -> list[str]:
    """SegEarth-OV's CLIP-friendly prompt for each class ("rangeland" -> "grass"); unknown classes unchanged."""
    return default_vocabulary().segearth_queries(classes, dataset)


def prompt_name(name: str, backend: str) -> str:
    """How `backend` is prompted for a class: upstream's raw dataset name ("storage tank" -> RemoteSAM "storagetank"),
    the canonical name for classes its upstream does not know."""
    return default_vocabulary().prompt_name(name, backend)


def segearth_threshold(dataset: str) -> float:
    """SegEarth-OV's probability threshold for the dataset's class file (upstream `prob_thd`)."""
    return default_vocabulary().segearth_entry(dataset).prob_threshold
