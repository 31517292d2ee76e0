"""The federation config: one YAML file that describes a federation for flows, agents and the CLI.

    federation: retail-consortium
    setting: vertical            # vertical | horizontal
    algorithm: forest
    consortium_key: {env: FEDFOREST_CONSORTIUM_KEY}   # or {file: path}; never the key itself
    tls: {ca: certs/ca.pem, master_cert: certs/master.pem, master_key: certs/master.key}
    master: {registry: registry/master, work_pool: master, signing_key: keys/master.key}
    institutions:
      - name: bank
        data: data/bank/*.parquet          # a path or glob of .parquet/.csv
        predict_data: data/bank/new/*.parquet
        contract: data_contracts/bank.yaml
        id_column: customer_id
        label: responded                   # only at the label holder
        endpoint: grpc+tls://127.0.0.1:8815
        work_pool: bank
        registry: registry/bank
        cert: certs/bank.pem
        key: certs/bank.key
        predictions: predictions/bank      # where batch predictions land (default: next to the registry)
    params: {n_estimators: 50, max_depth: 8}   # ForestParams fields
    training: {model_name: retail-response, holdout: 0.2, min_overlap: 50, promote_margin: 0.0,
               metric: accuracy, predict_for: bank}

Relative paths are resolved against the config file's folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedcore.errors import ConfigError
from fedcore.trees.params import ForestParams

SETTINGS = ("vertical", "horizontal")


@dataclass(frozen=True)
class Institution:
    """One institution: where its data, contract, agent and registry are."""

    name: str
    data: str
    contract: Path | None
    id_column: str
    endpoint: str
    work_pool: str
    registry: Path
    label: str | None = None
    predict_data: str | None = None
    cert: Path | None = None
    key: Path | None = None
    predictions: Path | None = None

    @property
    def is_label_holder(self) -> bool:
        """Whether this institution holds the label column."""
        return self.label is not None


@dataclass(frozen=True)
class FederationConfig:
    """A parsed, validated federation config."""

    path: Path
    federation: str
    setting: str
    algorithm: str
    institutions: list[Institution]
    master_registry: Path
    master_work_pool: str
    master_signing_key: Path | None
    params: ForestParams
    consortium_key: dict[str, str]
    tls: dict[str, Path] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)

    def institution(self, name: str) -> Institution:
        """The institution called `name`."""
        for inst in self.institutions:
            if inst.name == name:
                return inst
        raise ConfigError(f"{self.path}: no institution named {name!r}; known: {[i.name for i in self.institutions]}")

    @property
    def label_holder(self) -> Institution:
        """The institution that holds the label (vertical setting)."""
        return next(i for i in self.institutions if i.is_label_holder)

    def read_consortium_key(self) -> bytes:
        """The consortium key from the environment variable or file the config names."""
        if "env" in self.consortium_key:
            value = os.environ.get(self.consortium_key["env"])
            if not value:
                raise ConfigError(f"consortium key: environment variable {self.consortium_key['env']} is not set")
            return value.encode()
        path = self._resolve(self.consortium_key["file"])
        try:
            return path.read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"consortium key: cannot read {path}: {exc.strerror}") from exc

    def _resolve(self, value: str | os.PathLike) -> Path:
        return resolve(self.path, value)


def resolve(config_path: Path, value: str | os.PathLike) -> Path:
    """A config path made absolute against the config file's folder."""
    p = Path(os.path.expanduser(str(value)))
    return p if p.is_absolute() else (config_path.parent / p)


def read_yaml(path: Path, what: str) -> Any:
    """The parsed YAML file at `path`; unreadable or malformed files become one-line ConfigErrors."""
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from exc


def load_config(path: str | os.PathLike) -> FederationConfig:
    """Read and validate a federation config; every problem is a ConfigError naming the file and field."""
    path = Path(path).resolve()
    raw = read_yaml(path, "federation config")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return parse_config(raw, path)


def parse_config(raw: dict, path: Path) -> FederationConfig:
    """Validate an already-parsed config mapping (see module docstring for the fields)."""
    def need(mapping: dict, key: str, where: str) -> Any:
        if key not in mapping or mapping[key] in (None, ""):
            raise ConfigError(f"{path}: {where} needs '{key}'")
        return mapping[key]

    setting = raw.get("setting", "vertical")
    if setting not in SETTINGS:
        raise ConfigError(f"{path}: setting must be one of {SETTINGS}, got {setting!r}")
    key = need(raw, "consortium_key", "the federation")
    if not isinstance(key, dict) or len(key) != 1 or not ({"env", "file"} & set(key)):
        raise ConfigError(f"{path}: consortium_key must be {{env: VARIABLE}} or {{file: path}}, never the key itself")
    institutions = []
    for index, item in enumerate(need(raw, "institutions", "the federation")):
        where = f"institutions[{index}]"
        name = str(need(item, "name", where))
        where = f"institution {name!r}"
        institutions.append(Institution(
            name=name, data=str(resolve(path, need(item, "data", where))),
            contract=resolve(path, item["contract"]) if item.get("contract") else None,
            id_column=str(need(item, "id_column", where)), endpoint=str(item.get("endpoint", "")),
            work_pool=str(item.get("work_pool", name)),
            registry=resolve(path, item.get("registry", f"registry/{name}")), label=item.get("label"),
            predict_data=str(resolve(path, item["predict_data"])) if item.get("predict_data") else None,
            cert=resolve(path, item["cert"]) if item.get("cert") else None,
            key=resolve(path, item["key"]) if item.get("key") else None,
            predictions=resolve(path, item["predictions"]) if item.get("predictions") else None,
        ))
    names = [i.name for i in institutions]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: institution names must be unique, got {names}")
    holders = [i.name for i in institutions if i.is_label_holder]
    if setting == "vertical" and len(holders) != 1:
        raise ConfigError(f"{path}: a vertical federation needs exactly one institution with 'label', found {holders}")
    master = raw.get("master") or {}
    params = raw.get("params") or {}
    try:
        forest = ForestParams(**params)
    except TypeError as exc:
        raise ConfigError(f"{path}: params: {exc}") from exc
    return FederationConfig(
        path=path, federation=str(raw.get("federation", path.stem)), setting=setting,
        algorithm=str(raw.get("algorithm", "forest")), institutions=institutions,
        master_registry=resolve(path, master.get("registry", "registry/master")),
        master_work_pool=str(master.get("work_pool", "master")),
        master_signing_key=resolve(path, master["signing_key"]) if master.get("signing_key") else None,
        params=forest, consortium_key=dict(key),
        tls={k: resolve(path, v) for k, v in (raw.get("tls") or {}).items()},
        training=dict(raw.get("training") or {}),
    )
