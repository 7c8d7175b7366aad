"""Pure-numpy learning layer: datasets, partitions of the training set, models and clipping.

Nothing here touches the network. Every function is deterministic given its arguments (all
randomness comes from ``numpy.random.Generator(PCG64(SeedSequence(seed, ...)))``), so a peer
process and the in-process simulator compute bit-identical values from the same inputs.

* :mod:`.datasets` — synthetic and on-disk datasets, split / standardise / normalise, shard files
* :mod:`.partition` — split the training set over the nodes (iid, Dirichlet label skew, fixed)
* :mod:`.models` — logistic, multinomial, least-squares, ridge; per-example gradients; clipping
* :mod:`.prox` — objectives with proximal operators, the clipped proximal step of private ADMM
* :mod:`.admm` — private ADMM (central, federated, decentralized reference) and private
  proximal SGD, one process

The package re-exports the public names of :mod:`.datasets` and :mod:`.models`, and
``PARTITION_SCHEMES``, but NOT the function ``partition``: it has the name of its submodule and
re-exporting it would hide the module (``import coordinator_free.ml.partition`` would then
give the function). Import it as ``from coordinator_free.ml.partition import partition``.
"""

from __future__ import annotations

from coordinator_free.ml.datasets import (
    DATASET_KINDS,
    DataError,
    Dataset,
    load_dataset,
    load_shard,
    save_shard,
)
from coordinator_free.ml.models import MODEL_KINDS, Model, clip_rows, clipped_mean_grad, make_model
from coordinator_free.ml.partition import PARTITION_SCHEMES

__all__ = [
    "DATASET_KINDS",
    "MODEL_KINDS",
    "PARTITION_SCHEMES",
    "DataError",
    "Dataset",
    "Model",
    "clip_rows",
    "clipped_mean_grad",
    "load_dataset",
    "load_shard",
    "make_model",
    "save_shard",
]
