import random

import pytest

from bkspark.client import placement
from bkspark.errors import NotEnoughBookiesError


def test_random_ensemble_and_not_enough():
    bookies = {f"b{i}": {"address": f"h:{i}"} for i in range(5)}
    ens = placement.choose_ensemble(bookies, 3, rng=random.Random(1))
    assert len(set(ens)) == 3 and set(ens) <= set(bookies)
    with pytest.raises(NotEnoughBookiesError):
        placement.choose_ensemble(bookies, 6)


def test_rack_spread():
    bookies = {f"{r}{i}": {"rack": r} for r in "abc" for i in range(3)}
    for seed in range(20):
        ens = placement.choose_ensemble(bookies, 3, rng=random.Random(seed))
        assert {bookies[b]["rack"] for b in ens} == {"a", "b", "c"}


def test_replacement_excludes_ensemble_and_prefers_new_rack():
    bookies = {"a0": {"rack": "a"}, "a1": {"rack": "a"}, "b0": {"rack": "b"},
               "c0": {"rack": "c"}, "c1": {"rack": "c"}}
    ens = ["a0", "b0", "c0"]
    for seed in range(20):
        nb = placement.choose_replacement(bookies, ens, 1, rng=random.Random(seed))
        assert nb not in ens
    # replacing c0: racks a, b remain; candidates a1 (a, used), c1 (c, fresh) -> c1
    assert placement.choose_replacement(bookies, ens, 2, rng=random.Random(3)) == "c1"
    with pytest.raises(NotEnoughBookiesError):
        placement.choose_replacement({"a0": {}, "b0": {}}, ["a0", "b0"], 0)


def test_rack_shortfall_counts_racks_an_ensemble_could_span_but_does_not():
    bookies = {"a0": {"rack": "a"}, "a1": {"rack": "a"}, "b0": {"rack": "b"},
               "c0": {"rack": "c"}}
    assert placement.rack_shortfall(["a0", "b0", "c0"], bookies) == 0
    assert placement.rack_shortfall(["a0", "a1", "b0"], bookies) == 1
    assert placement.rack_shortfall(["a0", "a1"], bookies) == 1      # 2 members, 3 racks
    # a member that is not registered is not counted (the bookie check handles it)
    assert placement.rack_shortfall(["a0", "gone", "b0"], bookies) == 0
    # no labels: nothing to spread over
    assert placement.rack_shortfall(["x", "y"], {"x": {}, "y": {"rack": ""}}) == 0
    # an unlabelled bookie counts as one more rack, as choose_ensemble groups it
    assert placement.rack_shortfall(["a0", "a1", "u"], {**bookies, "u": {}}) == 1
