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
    "bkspark.client_settings": 1,
    "bkspark.client": 2, "bkspark.bookie": 2,
    "bkspark.log": 3,
    "bkspark.recovery": 4, "bkspark.spark": 4, "bkspark.dashboard": 4,
    "bkspark.localcluster": 5, "bkspark.cli": 5, "bkspark.testing": 5,
}
#: a bookie started with --autorecovery hosts autorecovery (its client settings are
#: bkspark.client_settings, a layer below both)
ALLOWED_UPWARD = {("bkspark.bookie", "bkspark.recovery")}


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


def test_a_bookie_loads_no_module_of_the_client(tmp_path):
    """The bookie process imports nothing of ``bkspark.client``, even transitively, even to
    read and check its autorecovery's ``client_config`` (``bkspark.client_settings`` does): a
    bookie without ``--autorecovery`` runs no client code."""
    import subprocess
    import sys
    client = tmp_path / "client.conf"
    client.write_text("add_timeout = 20\n")
    code = ("import sys, bkspark.bookie.command, bkspark.bookie.server\n"
            "from bkspark.bookie.config import BookieConfig\n"
            "c = BookieConfig(metadata_uri='sqlite:///x', journal_dir='j', ledger_dirs=['l'], "
            f"client_config={str(client)!r}).finalize()\n"
            "assert c.client_settings() == {'add_timeout': 20.0}, c.client_settings()\n"
            "print(sorted(m for m in sys.modules if m == 'bkspark.client' or "
            "m.startswith('bkspark.client.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
