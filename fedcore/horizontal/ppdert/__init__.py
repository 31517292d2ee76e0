"""PPD-ERT (Aminifar et al., SAC 2021): privacy-preserving distributed extremely randomized trees.

A global seed shared by the parties (and the master) generates the same candidate features everywhere without
communication: per open node, k distinct features and a uniform draw each. The draw places the threshold
(`thresholds`): within the grid cells that hold the node's rows, which the master learns through securely
aggregated extreme-cell indicators ("histogram", the default, `cells.py`), or uniformly in the feature's
DECLARED domain (`feature_ranges`, from the data contracts; categorical columns use their code domain), never
from the data ("domain", the paper's). Each party counts, per candidate and branch, its rows of each class;
the master only ever sees the SUM over parties, through pairwise-mask secure aggregation
(`fedcore.privacy.secagg`), picks the best candidate per node (gini or entropy) and tells the parties its
index. Growth, stopping and leaf values are the one grower's (`fedcore/trees/grower.py`), split choice shared
with FET (`fedcore/horizontal/growth.py`).

Rounds:

    hello          1       schema, domain and threshold-mode check; each party's X25519 public key, signed
    domain:    ppdert_level   1/level   previous decisions (+ the relayed signed keys, first level only)
                                        -> masked counts
    histogram: ppdert_cells   1/level   previous decisions (+ keys), grid intervals -> masked cell indicators
               ppdert_counts  1/level   thresholds -> masked counts
    model          1       the complete forest to every party

so a fit takes 2 + L rounds (histogram: 2 + 2L), L = number of levels with open nodes summed over tree
batches. Every masked round uses a fresh round id. A run resumed from checkpoints (`growth.py`) restores the
round counter with the finished batches, so every level keeps the round id it has in an uninterrupted run; the
resumed session has fresh keys and a fresh session id (new `hello`), so no mask of the interrupted session is
ever used again, and the counts of a batch grown again are the same plain values, masked anew. With a single
party there is no peer to mask with: it sends its plain counts, flagged `plain`, and the master accepts that
only when M = 1 or when the session was set up without secure aggregation (`secure=False`, which every party
must also be configured for: a baseline for measuring what the masks cost, not a privacy mode).

Authenticated keys (`fedcore.privacy.keyauth`): each party signs its public key, bound to `key_context`
of the hello it received and to its name, with its identity (an institution agent: its mutual-TLS
certificate's key; the simulator: an ephemeral Ed25519 key). The master relays key, signature and
credential; every party verifies every peer's before deriving masks, and a substituted, unsigned or
replayed key stops the session with `KeyAuthenticationError` naming the party.

Privacy `secagg-dp` (issue #31, `docs/privacy.md`): the same protocol with domain thresholds, each party
adding discrete Gaussian noise of 1/P of the variance to its counts before masking them (distributed DP: the
master's sums carry the model's whole budget), stating a noisy row count in hello and its ledger with the ack
(`noise`); the master plans alike, bounds the noisy sums and reads them with FET-GDP's noise-aware estimates
(`sums`).

Modules: `agreed` (what every role derives alike: candidates, domain fingerprint, key context), `cells`
(histogram thresholds: grid, indicators, spans, node boxes), `party`
(the institution's role and its protocol table), `master` (the level strategy of the one grower,
`fedcore/trees/grower.py`), `noise` and `sums` (secagg-dp's party and master sides), `rounds` (the master's
key relay and masked rounds) and `keys` (a party's signed key, its peers' verified), which horizontal
boosting (`fedcore/horizontal/boosting/`) shares.
"""
