"""What runs at an institution, in either setting.

Its data (`data`), its signed model tables and predictions (`storage`), the agent base that answers a
session's messages (`base`) and the server that exposes it (`serve`). The setting's own agents are
`vertical.agent` and `horizontal.agent`.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)
"""What an operator wants in the agent's run log (`fedforest agent serve` prints it; the agent flow
forwards it to its Prefect run): contract violations, the versions stored, the predictions written.
Every module of this package logs to a child of it."""
