"""The import direction of ARCHITECTURE.md holds: no package imports a higher layer (but the
one exception it names), and no module imports another package's ``_private`` names."""
from __future__ import annotations

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parent.parent

#: rank of each package (ARCHITECTURE.md, "Layers"): imports go to the same rank or lower
LAYERS = {
    "bkspark.errors": 0, "bkspark.ports": 0, "bkspark.private": 0, "bkspark.heap": 0,
    "bkspark.httpd": 0,
    "bkspark.logging_setup": 0, "bkspark._native": 0,
    "bkspark": 0,
    "bkspark.proto": 1, "metadata": 1, "bkspark.auth": 1, "bkspark.cluster_registry": 1,
    "bkspark.client": 2, "bkspark.bookie": 2,
    "bkspark.log": 3,
    "bkspark.recovery": 4, "bkspark.spark": 4, "bkspark.dashboard": 4,
    "bkspark.localcluster": 5, "bkspark.cli": 5, "bkspark.testing": 5,
}
#: a bookie started with --autorecovery hosts autorecovery (and reads its client settings)
ALLOWED_UPWARD = {("bkspark.bookie", "bkspark.recovery"), ("bkspark.bookie", "bkspark.client")}


def package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "metadata":
        return "metadata"
    if parts[0] != "bkspark":
        return None
    return ".".join(parts[:2]) if len(parts) > 1 else "bkspark"


def modules():
    for root in ("bkspark", "metadata"):
        for path in sorted((REPO / root).rglob("*.py")):
            if path.name.endswith("_pb2.py") or path.name.endswith("_pb2_grpc.py"):
                continue
            rel = path.relative_to(REPO).with_suffix("")
            name = ".".join(rel.parts)
            yield name.removesuffix(".__init__"), path


def imports(path: pathlib.Path):
    """(imported module, names) of every absolute import in the file, nested ones included."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []


def test_no_package_imports_a_higher_layer():
    wrong = []
    for name, path in modules():
        src = package_of(name)
        assert src in LAYERS, f"{name}: package {src} has no layer in ARCHITECTURE.md"
        for target, _ in imports(path):
            dst = package_of(target)
            if dst is None or dst == src:
                continue
            assert dst in LAYERS, f"{name} imports {target}: package {dst} has no layer"
            if LAYERS[dst] > LAYERS[src] and (src, dst) not in ALLOWED_UPWARD:
                wrong.append(f"{path.relative_to(REPO)}: {src} (layer {LAYERS[src]}) imports "
                             f"{target} (layer {LAYERS[dst]})")
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_another_packages_private_names():
    wrong = []
    for name, path in modules():
        src = package_of(name)
        for target, names in imports(path):
            dst = package_of(target)
            if dst is None or dst == src:
                continue
            # (bkspark._native is the C extension's module, public despite its name)
            private = [n for n in names if n.startswith("_") and not n.startswith("__")
                       and n != "_native"]
            if private or any(p.startswith("_") and p != "_native"
                              for p in target.split(".")[1:]):
                wrong.append(f"{path.relative_to(REPO)}: from {target} import {names}")
    assert not wrong, "\n".join(wrong)
