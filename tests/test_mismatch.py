"""rltldr_jax.mismatch: the one wording of a tree mismatch (orbax restores, HF loads, the Δθ analysis)."""

from rltldr_jax.mismatch import listing, mismatch_problems


def test_problems_name_each_kind_and_cut_long_lists():
    assert mismatch_problems(what="tensors") == []
    names = [f"w{i}" for i in range(14)]
    assert mismatch_problems(missing=["a", "b"], mis_shaped=["c: file (1, 2) ≠ config (2, 1)"], what="tensors") == [
        "missing tensors: a, b",
        "mis-shaped tensors: c: file (1, 2) ≠ config (2, 1)",
    ]
    [unexpected] = mismatch_problems(unexpected=names, what="arrays")
    assert unexpected == "unexpected arrays: " + ", ".join(names[:12]) + ", … (14 in all)"
    assert listing(["x", "y", "z"], "; ", limit=2) == "x; y; … (3 in all)"
