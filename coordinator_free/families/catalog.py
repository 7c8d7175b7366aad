"""The protocol names of each family, as plain data (a leaf module: the config layer and error
messages can name the protocols without loading any family). The registry
(``families.family_of``) is built from the family classes, which take their names from here."""

from __future__ import annotations

#: Private averaging (one noisy value per node, then gossip).
AVERAGING = ("muffliato",)
RANDOMIZED = ("randomized-gossip",)
#: Private learning from per-node data shards over gossip, and the central-DP curator.
LEARNING = ("muffliato-gd", "muffliato-sgd", "dsgd", "central-dp")
DECOR = ("decor",)
#: Token forwarding: a token (a running sum, a histogram, a model) walks the graph.
WALK = (
    "ring-sum",
    "ring-histogram",
    "complete-sum",
    "complete-histogram",
    "complete-sgd",
    "walk-sgd",
)
#: Private ADMM (consensus ERM): decentralized over a token walk (admm), and the one-process
#: centralized, federated and proximal-SGD baselines.
ADMM = ("admm", "admm-central", "admm-federated", "prox-sgd")
#: Every protocol that learns a model from data shards with rounds (named in error messages).
LEARNING_ALL = LEARNING + DECOR
#: Every protocol, in the order the docs list them.
ALL = AVERAGING + RANDOMIZED + LEARNING + DECOR + WALK + ADMM

#: The protocols that accept privacy.sigma = 0 (plain gossip, plain D-GD: no privacy), to show
#: what ``cfree attack`` reconstructs without noise.
NO_NOISE = ("muffliato", "dsgd", "muffliato-gd")
