"""How a trained model's references (the same run without noise, the trivial model) are said
to people: one line each, in every family's run summary."""

from __future__ import annotations


def _quality(acc, loss, what: str = "test loss") -> str:
    from coordinator_free.accounting.render import fmt

    head = "" if acc is None else f"test acc {acc:.4f}, "
    return f"{head}{what} {fmt(loss)}"


def lines(ref: dict | None) -> list[str]:
    """The references for people, one line each (nothing when there are none)."""
    if not ref:
        return []
    nf, tr = ref["noise_free"], ref["trivial"]
    trivial_what = f"the starting model, every parameter {tr['start']:g}" + (
        f"; always label {tr['majority_label']}" if "majority_label" in tr else ""
    )
    what = ref.get("measure", "test loss")
    return [
        "reference without noise (same run, sigma = 0): "
        + _quality(nf["test_accuracy"], nf["test_loss"], what),
        f"trivial reference ({trivial_what}): "
        + _quality(tr["test_accuracy"], tr["test_loss"], what),
    ]
