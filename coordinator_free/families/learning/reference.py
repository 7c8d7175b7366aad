"""What a private model is judged against: the same protocol without noise, and the trivial model.

A test accuracy of 0.86 says little on its own. Beside it, every learning run and simulation
prints two references computed from the public config alone (no private key is needed, so
``cfree simulate`` and ``cfree run`` print the same ones):

* ``noise_free``: the reference simulator run of the same config with ``privacy.sigma = 0`` (and
  ``privacy.sigma_cor = 0``): same data, shards, graph, schedule, step size and clipping. The gap
  between it and the private result is what the noise cost. For ``central-dp`` this is plain
  (non-private) gradient descent by the curator.
* ``trivial``: the starting model (every parameter ``model.init``, 0 by default: uniform class
  probabilities, or the prediction 0 for regression) and, for classifiers, the accuracy of
  always predicting the most frequent training label. A private result no better than this
  learned nothing.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["final_average", "noise_free_config", "references", "trivial"]


def noise_free_config(cfg):
    """``cfg`` with every noise source off (sigma = 0, sigma_cor = 0); nothing else changes."""
    return dataclasses.replace(
        cfg, privacy=dataclasses.replace(cfg.privacy, sigma=0.0, sigma_cor=0.0)
    )


def trivial(task) -> dict:
    """The quality of the models that need no data: the starting model's test loss and, for
    classifiers, the majority-label accuracy on the test set."""
    ds, model = task.dataset, task.model
    out = {"start": model.start, "test_loss": float(model.loss(model.init(), ds.X_test, ds.y_test))}
    if model.n_classes:
        labels, counts = np.unique(np.asarray(ds.y_train), return_counts=True)
        majority = labels[int(np.argmax(counts))]
        out["majority_label"] = int(majority)
        out["test_accuracy"] = float(np.mean(np.asarray(ds.y_test) == majority))
    else:
        out["test_accuracy"] = None
    return out


def final_average(sim) -> tuple[float | None, float]:
    """(test accuracy, test loss) of the node-average model after the last round of a learning
    simulation (what the round table of a run ends with)."""
    last = sim.metrics[-1]
    return last["avg_test_accuracy"], last["avg_test_loss"]


def references(cfg, final_quality) -> dict:
    """``{"noise_free": {test_accuracy, test_loss}, "trivial": {...}}`` for a learning config;
    ``final_quality(cfg)`` runs the family's simulator on a config and returns the final model's
    ``(test_accuracy, test_loss)`` as its results report them."""
    from coordinator_free.families.learning.protocol import make_task

    acc, loss = final_quality(noise_free_config(cfg))
    return {
        "noise_free": {"test_accuracy": acc, "test_loss": loss},
        "trivial": trivial(make_task(cfg)),
    }
