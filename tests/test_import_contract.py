"""The package boundaries of docs/architecture.md, checked on the source (an import-linter
style contract without the dependency): every import statement of every module, including
imports inside functions, is read with :mod:`ast`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("securefkm", "protocols", "attacks")


def _imports(path: Path, root: Path = ROOT):
    """(line, absolute module name, top-level?) of every import in ``path``; relative imports
    resolved against the module's own package."""
    package = list(path.relative_to(root).parts[:-1])
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, id(node) in top
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            yield node.lineno, name, id(node) in top
            for alias in node.names:  # `from securefkm.algorithms import _kmeans`
                yield node.lineno, f"{name}.{alias.name}", id(node) in top


def _modules(package: str):
    return sorted((ROOT / package).rglob("*.py"))


def _private(name: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in name.split(".")[1:])


@pytest.mark.parametrize("package", ["protocols", "attacks"])
def test_no_private_module_of_securefkm_is_imported(package):
    """``protocols`` and ``attacks`` use securefkm's public modules only (kernels,
    validation, lazy, messages, layers, transcript, exceptions, ...), never a private one."""
    bad = [f"{p.relative_to(ROOT)}:{line}: {name}"
           for p in _modules(package) for line, name, _ in _imports(p)
           if name.split(".")[0] == "securefkm" and _private(name)]
    assert not bad, "private securefkm modules imported:\n" + "\n".join(bad)


@pytest.mark.parametrize("importer, imported", [
    ("securefkm", "protocols"), ("securefkm", "attacks"), ("protocols", "attacks"),
    ("attacks", "protocols"),
])
def test_no_private_module_across_packages(importer, imported):
    bad = [f"{p.relative_to(ROOT)}:{line}: {name}"
           for p in _modules(importer) for line, name, _ in _imports(p)
           if name.split(".")[0] == imported and _private(name)]
    assert not bad, f"{importer} imports private modules of {imported}:\n" + "\n".join(bad)


def test_protocols_never_import_attacks():
    bad = [f"{p.relative_to(ROOT)}:{line}: {name}"
           for p in _modules("protocols") for line, name, _ in _imports(p) if name.split(".")[0] == "attacks"]
    assert not bad, "\n".join(bad)


def test_securefkm_imports_attacks_only_lazily_from_its_commands():
    """The runtime, algorithms and estimators never import ``attacks``; the CLI and the demo
    (commands that run attacks) do so inside functions, so ``import securefkm`` never loads it."""
    bad = []
    for p in _modules("securefkm"):
        for line, name, top in _imports(p):
            if name.split(".")[0] != "attacks":
                continue
            where = p.relative_to(ROOT).as_posix()
            command = where in ("securefkm/cli.py", "securefkm/demo.py")
            if top or not command:
                bad.append(f"{p.relative_to(ROOT)}:{line}: {name}")
    assert not bad, "\n".join(bad)


def test_installed_packages_never_import_the_benchmarks():
    """The development benchmarks (top-level ``benchmarks/``, run from a checkout, not in the
    wheel) import the library, never the reverse: no module of securefkm, protocols or
    attacks imports ``benchmarks``, at the top or inside a function."""
    assert (ROOT / "benchmarks" / "__init__.py").is_file() and "benchmarks" not in PACKAGES
    assert not list((ROOT / "securefkm" / "bench").glob("*.py")), "the benchmarks live in benchmarks/, not in the package"
    bad = [f"{p.relative_to(ROOT)}:{line}: {name}"
           for pkg in PACKAGES for p in _modules(pkg) for line, name, _ in _imports(p)
           if name.split(".")[0] == "benchmarks"]
    assert not bad, "\n".join(bad)


def test_the_contract_sees_a_violation(tmp_path):
    """The checker itself: private imports, absolute, relative and inside a function, are found."""
    probe = tmp_path / "securefkm" / "estimators" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("from securefkm.algorithms import _kmeans\nfrom ..algorithms._fcm import x\n"
                     "def f():\n    import attacks.passive\n    from benchmarks import speed\n")
    found = {name: top for _, name, top in _imports(probe, tmp_path)}
    assert found["benchmarks"] is False and "benchmarks.speed" in found
    assert _private("securefkm.algorithms._kmeans") and "securefkm.algorithms._kmeans" in found
    assert "securefkm.algorithms._fcm" in found and _private("securefkm.algorithms._fcm")
    assert found["attacks.passive"] is False and not _private("securefkm.kernels")
