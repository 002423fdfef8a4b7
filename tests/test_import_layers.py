"""The package's layers, enforced (docs/ARCHITECTURE.md draws them).

Every import inside ``aprfast/`` (module level and inside functions alike) is read from the
source and checked against four rules:

1. a module imports only from its own layer or the layers below it;
2. the library (everything but ``cli/`` and ``tui/``) never imports ``cli/`` or ``tui/``,
   ``tui/`` never imports ``cli/``, and nothing below ``cli/`` imports the ``aprfast``
   facade (``aprfast/__init__.py``, which loads everything);
3. no module imports a private name (``_name``, or a module whose name starts with ``_``)
   from another package: what a package offers its neighbours is public in it.  The
   compiled kernels at the top (``aprfast._crc`` ...) and their selector are the one
   exception: every layer is built on them;
4. no import cycle between packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import aprfast  # noqa: E402

# the package that runs (the installed wheel in CI, whose sources it ships; the checkout here)
ROOT = Path(aprfast.__file__).resolve().parent
DOCS = Path(__file__).resolve().parent.parent / "docs"

#: bottom to top; a module's layer is that of its longest matching prefix
LAYERS = [
    ("vocabulary", ["aprfast._backend", "aprfast._version", "aprfast._optional", "aprfast._moved",
                    "aprfast._pure", "aprfast.errors", "aprfast.limits", "aprfast.config",
                    "aprfast.dtypes", "aprfast.tensors"]),
    ("io", ["aprfast.io"]),
    ("remote", ["aprfast.remote"]),
    ("codecs, crypto, numerics", ["aprfast.codecs", "aprfast.crypto", "aprfast.numerics"]),
    ("security", ["aprfast.security"]),
    ("layouts", ["aprfast.layouts"]),
    ("files", ["aprfast.files"]),
    ("v1", ["aprfast.v1"]),
    ("api", ["aprfast.api", "aprfast.stream", "aprfast.distributed"]),
    ("adapters", ["aprfast.numpy", "aprfast.torch", "aprfast.jax"]),
    ("convert", ["aprfast.convert"]),
    ("tools", ["aprfast.tools"]),
    ("tui", ["aprfast.tui"]),
    ("cli", ["aprfast.cli"]),
]
#: the compiled kernels and the top level's own machinery (backend choice, version, optional
#: imports): private to users, not to the package, so every layer may import them
KERNELS = {"aprfast._blocks", "aprfast._crc", "aprfast._half", "aprfast._index", "aprfast._inputs",
           "aprfast._memory", "aprfast._metascan", "aprfast._quant", "aprfast._stats",
           "aprfast._backend", "aprfast._version", "aprfast._optional"}
FACADE = "aprfast"


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path, parts[-1] == "__init__"


MODULES = {name: (path, ispkg) for name, path, ispkg in _modules()}
KNOWN = set(MODULES) | KERNELS


def layer_of(module: str) -> int:
    best, rank = -1, None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), index
    if module in KERNELS:
        return 0
    if rank is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS here and to docs/ARCHITECTURE.md")
    return rank


def package_of(module: str) -> str:
    """aprfast.files.reader -> aprfast.files; aprfast.errors -> aprfast."""
    if MODULES.get(module, (None, False))[1]:
        return module
    return module.rpartition(".")[0]


def imports(module: str):
    """(target module, imported name or None, line) for every aprfast import in module."""
    path, ispkg = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module if ispkg else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == FACADE or alias.name.startswith(FACADE + "."):
                    yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not (target == FACADE or target.startswith(FACADE + ".")):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in KNOWN:
                    yield sub, None, node.lineno
                else:
                    yield target, alias.name, node.lineno


EDGES = [(module, target, name, line) for module in MODULES for target, name, line in imports(module)]


def _where(module, line):
    return f"{MODULES[module][0].relative_to(ROOT.parent)}:{line}"


def test_every_module_has_a_layer():
    for module in MODULES:
        if module != FACADE:
            layer_of(module)


def test_imports_point_down():
    wrong = []
    for module, target, _, line in EDGES:
        if module == FACADE or target == FACADE:
            continue
        if layer_of(target) > layer_of(module):
            wrong.append(f"{_where(module, line)}: {module} ({LAYERS[layer_of(module)][0]}) imports "
                         f"{target} ({LAYERS[layer_of(target)][0]})")
    assert not wrong, "imports from a higher layer:\n" + "\n".join(wrong)


def test_the_library_never_imports_its_command_line():
    wrong = []
    for module, target, _, line in EDGES:
        if module == FACADE:
            continue
        if target == FACADE and layer_of(module) < layer_of("aprfast.tui"):
            wrong.append(f"{_where(module, line)}: {module} imports the aprfast facade")
        elif target.startswith("aprfast.cli") and not module.startswith("aprfast.cli"):
            wrong.append(f"{_where(module, line)}: {module} imports {target}")
        elif target.startswith("aprfast.tui") and not module.startswith(("aprfast.tui", "aprfast.cli")):
            wrong.append(f"{_where(module, line)}: {module} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_no_private_names_across_packages():
    wrong = []
    for module, target, name, line in EDGES:
        if target in KERNELS or target == FACADE:
            continue
        if package_of(target) == package_of(module) or target.startswith(package_of(module) + "."):
            continue  # inside one package (a subpackage's module reaching its own private helper)
        private_module = any(part.startswith("_") and part != "__init__" for part in target.split(".")[1:])
        if private_module or (name is not None and name.startswith("_") and not name.startswith("__")):
            what = f"{target}.{name}" if name else target
            wrong.append(f"{_where(module, line)}: {module} imports {what}")
    assert not wrong, "private names imported from another package:\n" + "\n".join(wrong)


def test_no_cycles_between_packages():
    graph: dict[str, set[str]] = {}
    for module, target, _, _ in EDGES:
        if module == FACADE or target == FACADE or target in KERNELS:
            continue
        a, b = package_of(module), package_of(target)
        if a != b and not b.startswith(a + ".") and not a.startswith(b + "."):
            graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}
    cycles = []

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]) if nxt in trail else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles between packages:\n" + "\n".join(cycles)


@pytest.mark.parametrize("module", ["aprfast.cli", "aprfast.tui"])
def test_the_checker_sees_the_top(module):
    # the rules above would pass vacuously if the walk missed a package
    assert module in MODULES
    assert any(m == module for m, *_ in EDGES)


def test_the_architecture_page_names_every_package_and_stays_short():
    # docs/ARCHITECTURE.md is the map a newcomer reads: every package of the tree is on it
    page = (DOCS / "ARCHITECTURE.md").read_text(encoding="utf-8")
    packages = sorted({m.split(".")[1] for m in MODULES if m.count(".") >= 1 and MODULES[m][1] and m != FACADE
                       and not m.split(".")[1].startswith("_")})
    missing = [p for p in packages if f"`{p}/`" not in page]
    assert not missing, f"docs/ARCHITECTURE.md does not name these packages: {missing}"
    assert len(page.splitlines()) <= 250
