"""How every party answers the master: one declared protocol table per party type, one dispatcher.

A party does not look a handler up by the message's kind. Its class declares a `Protocol`: states, and
`Step`s saying that in these states a message of this kind (for a party in one of these roles, or any
role) is answered by that handler with one of these reply kinds, after which the party is in that state.
Its `ProtocolStateMachine` then refuses, with a `ProtocolError` and a logged reason,

* a kind the protocol does not have (another algorithm's messages, anything made up),
* a kind of the protocol meant for other roles (a label holder's request at a passive party, a Paillier
  request at a plain-mode party),
* a kind of the protocol out of order (a level before the session's first message, a second answer to
  the same step, ...),

and moves to the next state only when the handler answered. A refused or failed message leaves the
state as it was. Three failures are told apart, without guessing:

* a malformed message (a header field or array missing, of the wrong type, shape or range, a parameter
  out of its allowed range) is the peer's fault: handlers read fields through `Header`/`Arrays`'s typed
  readers, which raise MalformedMessage, and the message is refused with one line naming the field;
* any other ProtocolError a handler raises is a refusal it wrote itself (it quotes names and counts);
* any other exception (a KeyError, TypeError, ValueError, an InputError on the party's own data, ...) is
  our own bug: its traceback (its text withheld) goes to this party's log, and the
  peer gets InternalError's generic line, naming no internals.

A reply kind the step does not declare is a bug in the party and raises RuntimeError instead of leaving
the party.

The tables live beside their parties: `fedcore.vertical.party` (Federated Forest, plain and Paillier,
label holder and passive), `fedcore.horizontal.fet.party` (Federated Extra-Trees),
`fedcore.horizontal.ppdert.party` (PPD-ERT), `fedcore.horizontal.boosting.party` (horizontal boosting).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fedcore.errors import MalformedMessage, ProtocolError, internal_error
from fedcore.protocol.messages import Message

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Step:
    """One row of a protocol table: which message a party answers in which state, how, and what follows.

    In any of `states`, a message of `kind` (at a party whose role is in `roles`; None: any role) is answered
    by the party's method `handler` with a message of one of the `replies` kinds; then the party is in state
    `next`.
    """

    states: tuple[str, ...]
    kind: str
    next: str
    replies: tuple[str, ...]
    roles: frozenset[str] | None = None
    handler: str = ""

    def __init__(self, states: str | Iterable[str], kind: str, next: str, replies: str | Iterable[str],
                 roles: Iterable[str] | None = None, handler: str | None = None) -> None:
        """A step; `states` and `replies` may be one string; `handler` defaults to `_on_<kind>`."""
        object.__setattr__(self, "states", (states,) if isinstance(states, str) else tuple(states))
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "next", next)
        object.__setattr__(self, "replies", (replies,) if isinstance(replies, str) else tuple(replies))
        object.__setattr__(self, "roles", None if roles is None else frozenset(roles))
        object.__setattr__(self, "handler", handler or f"_on_{kind}")


class Protocol:
    """A party type's declared protocol: its states (name -> what the state means) and steps."""

    def __init__(self, name: str, initial: str, states: dict[str, str], steps: Iterable[Step]) -> None:
        """The table of `steps`; refuses undeclared states and two steps for one message and role."""
        self.name = name
        self.initial = initial
        self.states = dict(states)
        self.steps = tuple(steps)
        self._table: dict[tuple[str, str], list[Step]] = {}
        for step in self.steps:
            unknown = [s for s in (*step.states, step.next) if s not in self.states]
            if unknown:
                raise ValueError(f"protocol {name!r}: step {step.kind!r} names undeclared states {unknown}")
            for state in step.states:
                rivals = self._table.setdefault((state, step.kind), [])
                for other in rivals:
                    if other.roles is None or step.roles is None or other.roles & step.roles:
                        raise ValueError(f"protocol {name!r}: two steps for {step.kind!r} in state {state!r} "
                                         "share a role")
                rivals.append(step)
        if initial not in self.states:
            raise ValueError(f"protocol {name!r}: undeclared initial state {initial!r}")
        self.kinds = frozenset(step.kind for step in self.steps)
        """Every message kind a party of this type may be sent."""
        self.replies = frozenset(kind for step in self.steps for kind in step.replies)
        """Every message kind a party of this type may answer with."""
        self.has_roles = any(step.roles is not None for step in self.steps)

    def step(self, state: str, kind: str, role: str | None) -> Step | None:
        """The step that answers `kind` in `state` for `role`, or None."""
        for step in self._table.get((state, kind), ()):
            if step.roles is None or role in step.roles:
                return step
        return None

    def expected(self, state: str, role: str | None) -> list[str]:
        """The kinds a party in `state` with `role` accepts, sorted."""
        return sorted({kind for (s, kind) in self._table if s == state and self.step(state, kind, role)})

    def refusal(self, party: str, state: str, kind: str, role: str | None) -> str:
        """Why a party in `state` with `role` refuses a message of `kind` (for a kind it has no step for)."""
        if kind not in self.kinds:
            return (f"party {party!r} cannot handle message kind {kind!r}: not a message of the {self.name} "
                    f"protocol (it answers {', '.join(sorted(self.kinds))})")
        roles = {r for step in self.steps if step.kind == kind for r in (step.roles or ())}
        if roles and not any(step.kind == kind and (step.roles is None or role in step.roles)
                             for step in self.steps):
            return (f"party {party!r} refuses {kind!r}: in the {self.name} protocol only a party in role "
                    f"{' or '.join(sorted(roles))} answers it, this party is {role}")
        expected = self.expected(state, role)
        return (f"party {party!r} refuses {kind!r} out of protocol order: in state {state!r} "
                f"({self.states[state]}) it expects {' or '.join(expected) if expected else 'nothing'}")

    def start(self, logger: logging.Logger | None = None) -> ProtocolStateMachine:
        """A state machine for one party, in the initial state; refusals go to `logger`."""
        return ProtocolStateMachine(self, logger)


class ProtocolStateMachine:
    """One party's position in its protocol; `handle` is the party's only way to answer a message."""

    def __init__(self, protocol: Protocol, logger: logging.Logger | None = None) -> None:
        """A party's position in `protocol`, starting in its initial state."""
        self.protocol = protocol
        self.state = protocol.initial
        self.log = logger or log

    def handle(self, party: Any, message: Message) -> Message:
        """Answer `message` with `party`'s handler for it, or refuse it (see the module docstring).

        `party` has a `name` and, when the protocol has role-specific steps, a `protocol_role`.
        """
        name, kind = party.name, message.kind
        role = party.protocol_role if self.protocol.has_roles else None
        step = self.protocol.step(self.state, kind, role)
        if step is None:
            raise self._refuse(kind, self.protocol.refusal(name, self.state, kind, role))
        try:
            reply = getattr(party, step.handler)(message)
        except MalformedMessage as error:
            raise self._refuse(kind, f"party {name!r} refuses a malformed {kind!r} message: {error}",
                               MalformedMessage) from error
        except ProtocolError as error:
            self._refuse(kind, str(error))
            raise
        except Exception as error:
            raise internal_error(self.log, name, kind, error) from error
        if reply.kind not in step.replies:
            raise RuntimeError(f"party {name!r} answered {kind!r} with {reply.kind!r}; the "
                               f"{self.protocol.name} protocol declares {', '.join(step.replies)}")
        self.state = step.next
        return reply

    def _refuse(self, kind: str, reason: str, error: type[ProtocolError] = ProtocolError) -> ProtocolError:
        self.log.warning("refused a %r message: %s", kind, reason)
        return error(reason)
