"""A small demo federation for flow and deployment tests."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path


def small_federation(work, n_customers: int, seed: int, params: dict, n_new: int | None = None):
    """The demo federation in `work`: returns (config path, scenario).

    Fewer customers and a small forest, so flows run fast; `n_new` customers in the new batch (default:
    a fifth).
    """
    import yaml

    from flows.demos.vertical import prepare_workspace

    config_path, scenario = prepare_workspace(work, n_customers=n_customers, seed=seed, n_new=n_new)
    raw = yaml.safe_load(config_path.read_text())
    raw["params"] = {**params, "random_state": 0}
    raw["training"]["connect_timeout_s"] = 90
    config_path.write_text(yaml.safe_dump(raw))
    return config_path, scenario


@dataclass(frozen=True)
class Federation:
    """A demo federation's folder, its config and scenario and, once trained, the run's result."""

    work: Path
    config_path: Path
    scenario: dict
    result: dict | None = None


def copy_of(federation: Federation, destination: Path) -> Federation:
    """A copy of `federation` in `destination`, its agents on other ports.

    Data, keys, certificates, registries and predictions are copied, and its scenario's paths point into the
    copy.
    """
    from tests.flows.crashes import copy_federation

    config_path = copy_federation(federation.work, destination)
    old, new = str(federation.work), str(destination)

    def moved(value):
        if isinstance(value, dict):
            return {k: moved(v) for k, v in value.items()}
        inside = isinstance(value, str) and (value == old or value.startswith(old + "/"))
        return new + value[len(old):] if inside else value

    return replace(federation, work=destination, config_path=config_path, scenario=moved(federation.scenario))


def horizontal_session_from_config(config, params=None, cluster=None, record_transcript=False):
    """A horizontal session over in-process agents that load their data from `config`, contracts checked.

    The session and the agents are the ones the config's algorithm registers (`fedcore.algorithms`), as
    `fedforest` deploys them, with the config's privacy and held-out share. `params`: the engine's parameters
    in place of the config's (None: the config's). Each agent reads its institution's configured source when
    the session starts (`institution_from_config`), as a served agent does; one with `compute: dask` on
    `cluster` (a `fedcore.compute.cluster.Cluster`; default: its config's). `record_transcript`: the
    transport keeps every message's kind, sender and receiver (`session.transport.transcript`).
    """
    from dataclasses import replace
    from functools import partial

    from fedcore.agents.data import institution_from_config
    from fedcore.privacy.keyauth import ephemeral_identities
    from fedcore.protocol.messages import Message
    from fedcore.transport.inprocess import InProcessTransport

    if params is not None:
        config = replace(config, params=params)
    entry, names = config.implementation, [i.name for i in config.institutions]
    identities = ephemeral_identities(names)
    agents = {name: entry.institution_agent(config, partial(institution_from_config, config, name, cluster),
                                            name, identities[name]) for name in names}
    transport = InProcessTransport({n: a.handle for n, a in agents.items()},
                                   record_transcript=record_transcript)
    transport.exchange({n: Message("validation_report") for n in agents})
    return entry.open_session(config, transport)


def vertical_session_from_config(config, cluster=None):
    """A vertical session (5 trees of depth 5) over in-process agents that load their data from `config`.

    An agent with `compute: dask` works on `cluster` (a `fedcore.compute.cluster.Cluster`; default: its
    config's).
    """
    from fedcore.agents.data import institution_from_config
    from fedcore.protocol.messages import Message
    from fedcore.transport.inprocess import InProcessTransport
    from fedcore.trees.params import ForestParams
    from fedcore.vertical.agent import VerticalInstitutionAgent
    from fedcore.vertical.session import VerticalSession

    key = b"consortium-key-for-tests-0123456789"
    agents = {i.name: VerticalInstitutionAgent(
        lambda name=i.name: institution_from_config(config, name, cluster), key) for i in config.institutions}
    transport = InProcessTransport({n: a.handle for n, a in agents.items()})
    transport.exchange({n: Message("validation_report") for n in agents})
    return VerticalSession(transport, ForestParams(n_estimators=5, max_depth=5, random_state=1),
                           holdout_fraction=0.2, min_overlap=50)
