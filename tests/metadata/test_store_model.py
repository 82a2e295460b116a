"""Model-based test: random operation sequences give the same results (values and errors)
on a store as on a simple in-memory model of ZooKeeper semantics. Runs on both stores."""
from __future__ import annotations

import uuid

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from bkspark.errors import (
    BadRequestError,
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)

NAMES = st.sampled_from(["a", "b", "c"])
RELPATHS = st.lists(NAMES, min_size=1, max_size=3).map(lambda parts: "/" + "/".join(parts))
VERSIONS = st.integers(-1, 3)
DATA = st.binary(max_size=8)


def make_machine(store):
    class StoreModel(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.base = f"/m-{uuid.uuid4().hex[:10]}"
            store.create(self.base, b"")
            self.nodes: dict[str, list] = {}  # relpath -> [data, version, ephemeral]

        def parent(self, rel):
            return rel.rsplit("/", 1)[0]

        def outcome(self, fn, *args, **kwargs):
            try:
                return ("ok", fn(*args, **kwargs))
            except (NodeExistsError, NoNodeError, BadVersionError, NotEmptyError,
                    BadRequestError) as e:
                return (type(e).__name__, None)

        @rule(rel=RELPATHS, data=DATA, ephemeral=st.booleans(), makepath=st.booleans())
        def create(self, rel, data, ephemeral, makepath):
            got = self.outcome(store.create, self.base + rel, data, ephemeral=ephemeral,
                               makepath=makepath)
            ancestors = []
            p = self.parent(rel)
            while p:
                ancestors.append(p)
                p = self.parent(p)
            if rel in self.nodes:
                expected = ("NodeExistsError", None)
            elif not makepath and ancestors and ancestors[0] not in self.nodes:
                expected = ("NoNodeError", None)
            elif any(self.nodes.get(a, [None, None, False])[2] for a in ancestors):
                expected = ("BadRequestError", None)
            else:
                for a in ancestors:
                    self.nodes.setdefault(a, [b"", 0, False])
                self.nodes[rel] = [data, 0, ephemeral]
                expected = ("ok", self.base + rel)
            assert got == expected, (rel, got, expected)

        @rule(rel=RELPATHS, data=DATA, version=VERSIONS)
        def set(self, rel, data, version):
            got = self.outcome(store.set, self.base + rel, data, version=version)
            node = self.nodes.get(rel)
            if node is None:
                expected = ("NoNodeError", None)
            elif version not in (-1, node[1]):
                expected = ("BadVersionError", None)
            else:
                node[0], node[1] = data, node[1] + 1
                expected = ("ok", node[1])
            assert got == expected, (rel, got, expected)

        @rule(rel=RELPATHS, version=VERSIONS)
        def delete(self, rel, version):
            got = self.outcome(store.delete, self.base + rel, version=version)
            node = self.nodes.get(rel)
            if node is None:
                expected = ("NoNodeError", None)
            elif version not in (-1, node[1]):
                expected = ("BadVersionError", None)
            elif any(self.parent(p) == rel for p in self.nodes):
                expected = ("NotEmptyError", None)
            else:
                del self.nodes[rel]
                expected = ("ok", None)
            assert got == expected, (rel, got, expected)

        @rule(rel=RELPATHS)
        def read(self, rel):
            node = self.nodes.get(rel)
            assert self.outcome(store.get, self.base + rel) == (
                ("NoNodeError", None) if node is None else ("ok", (node[0], node[1])))
            assert store.exists(self.base + rel) == (None if node is None else node[1])
            kids = sorted(p.rsplit("/", 1)[1] for p in self.nodes if self.parent(p) == rel)
            assert self.outcome(store.children, self.base + rel) == (
                ("NoNodeError", None) if node is None else ("ok", kids))

        def teardown(self):
            for rel in sorted(self.nodes, key=lambda p: -p.count("/")):
                store.delete(self.base + rel)
            store.delete(self.base)

    return StoreModel


def test_store_matches_model(store):
    run_state_machine_as_test(
        make_machine(store),
        settings=settings(max_examples=25, stateful_step_count=30, deadline=None,
                          suppress_health_check=list(HealthCheck)))
