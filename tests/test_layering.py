"""Architecture rules: mlm_core imports no orchestration/tracking/validation framework; GE lives in one module."""
from __future__ import annotations

import ast
import subprocess
import sys

from conftest import REPO

FRAMEWORKS = ("prefect", "mlflow", "great_expectations")


def _imports(path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def test_mlm_core_imports_no_framework_statically():
    offenders = {str(p.relative_to(REPO)): sorted(_imports(p) & set(FRAMEWORKS))
                 for p in (REPO / "mlm_core").rglob("*.py") if _imports(p) & set(FRAMEWORKS)}
    assert not offenders, offenders


def test_importing_every_core_module_loads_no_framework():
    mods = sorted("mlm_core." + ".".join(p.relative_to(REPO / "mlm_core").with_suffix("").parts)
                  for p in (REPO / "mlm_core").rglob("*.py") if p.name != "__init__.py" and "demo" not in p.parts)
    code = ("import importlib, sys\n"
            f"for m in {mods!r}:\n    importlib.import_module(m)\n"
            f"bad = [f for f in {FRAMEWORKS!r} if f in sys.modules]\nassert not bad, bad\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]


def test_great_expectations_is_imported_in_one_module_only():
    users = sorted(str(p.relative_to(REPO)) for d in ("mlm_core", "tasks", "flows")
                   for p in (REPO / d).rglob("*.py") if "great_expectations" in _imports(p))
    assert users == ["tasks/validation/gx.py"]


def test_config_modules_are_leaves():
    """The mlm_core.config package's model modules (the tree in __init__, its sections, the effect markers) import
    only pydantic, the language table and each other (so every layer can import the config without pulling in the
    rest of the project); config/io.py (reading files, overrides) may import the errors too."""
    allowed = {"mlm_core.languages", "mlm_core.config"}
    offenders = {}
    files = sorted((REPO / "mlm_core" / "config").glob("*.py"))
    assert {p.name for p in files} >= {"__init__.py", "bias.py", "data.py", "eval.py", "ops.py", "train.py",
                                       "effects.py", "io.py"}
    for p in files:
        if p.name == "io.py":
            continue
        tree = ast.parse(p.read_text(encoding="utf-8"))
        mods = ({n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
                | {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names})
        mods = {m for m in mods if m.split(".")[0] == "mlm_core"}
        bad = sorted(m for m in mods if m not in allowed and not m.startswith("mlm_core.config."))
        if bad:
            offenders[p.name] = bad
    assert not offenders, offenders


# ------------------------------------------------------------------------------ the import graph (issue 22, item 5)
# Measured from the AST of every .py under mlm_core/, tasks/, flows/: module-level AND function-level imports of the
# project's own modules, relative imports resolved. Three figures, each with its target:
#   circles:            strongly connected components of size > 1 (at most MAX_CIRCLES);
#   imports running up: an import from a lower declared layer to a higher one (0);
#   private imports:    `from X import _name` or `X._name` where X is another project module (0).

import functools  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402

PACKAGES = ("mlm_core", "tasks", "flows")
MAX_CIRCLES = 2

# The layers, lowest first: a module may import its own layer and the layers below it, never one above.
# A module matches the first pattern (a regex on the dotted name) that matches it. Top level: flows above tasks
# above mlm_core; inside mlm_core: leaves < the store < stage packages < the stage graph < sweep/report/compare.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core leaves", (
        r"mlm_core$", r"mlm_core\.config(\..*)?$",
        r"mlm_core\.(artifacts|errors|languages|redact|textcheck|sampling"
        r"|figures|unigram|tensorfile|pathcheck|progress|external|reproducible|commands|partition_size)$",
        r"mlm_core\.demo(\..*)?$")),
    ("core store", (r"mlm_core\.(store|locks|partitions)$",)),
    ("core stages", (
        r"mlm_core\.(normalize|tokenizer|shards|masking|model|train|evaluate|audit"
        r"|bias|register|fillmask)(\..*)?$",)),
    ("core stage graph", (r"mlm_core\.(stages|stage_calls)$",)),
    ("core sweep/report", (r"mlm_core\.(sweep|budget|report|compare|stats)(\..*)?$",)),
    ("tasks", (r"tasks(\..*)?$",)),
    ("flows", (r"flows(\..*)?$",)),
)


def layer_of(module: str, layers=LAYERS) -> int:
    for rank, (_, patterns) in enumerate(layers):
        if any(re.match(p, module) for p in patterns):
            return rank
    raise AssertionError(f"module {module} is in no declared layer: add it to LAYERS in tests/test_layering.py")


def project_modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the packages (a package's __init__.py is the package)."""
    out = {}
    for pkg in packages:
        for p in sorted((root / pkg).rglob("*.py")):
            parts = p.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _resolve_from(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _owner(name: str, modules) -> str | None:
    """The longest prefix of a dotted name that is a project module."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in modules:
            return ".".join(parts[:i])
    return None


def read_imports(root: Path, packages=PACKAGES):
    """-> (modules, edges {module: {imported project module: line}}, private [(module, target, name, line)])."""
    modules = project_modules(root, packages)
    edges: dict[str, dict[str, int]] = {m: {} for m in modules}
    private: list[tuple[str, str, str, int]] = []
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_pkg = path.name == "__init__.py"
        aliases: dict[str, str] = {}  # a local name bound to a project module (for X._name attribute access)

        def edge(target, line, mod=mod):
            if target and target != mod:
                edges[mod].setdefault(target, line)

        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    target = _owner(a.name, modules)
                    edge(target, node.lineno)
                    if a.asname and a.name in modules:
                        aliases[a.asname] = a.name
                    elif not a.asname and a.name.split(".")[0] in modules:
                        aliases[a.name.split(".")[0]] = a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_from(node, mod, is_pkg)
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    if sub in modules:  # `from pkg import submodule`
                        edge(sub, node.lineno)
                        aliases[a.asname or a.name] = sub
                        continue
                    target = _owner(base, modules)
                    edge(target, node.lineno)
                    if target == base and target != mod and a.name.startswith("_") and not a.name.startswith("__"):
                        private.append((mod, target, a.name, node.lineno))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                chain, v = [], node.value
                while isinstance(v, ast.Attribute):
                    chain.append(v.attr)
                    v = v.value
                if isinstance(v, ast.Name) and v.id in aliases:
                    target = ".".join([aliases[v.id]] + chain[::-1])
                    if target in modules and target != mod:
                        private.append((mod, target, node.attr, node.lineno))
    return modules, edges, sorted(set(private))


def strongly_connected(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; -> the components of more than one module, each sorted, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in edges:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return sorted(out)


def describe_circles(circles, edges) -> str:
    lines = []
    for comp in circles:
        lines.append(f"circle of {len(comp)}: " + ", ".join(comp))
        members = set(comp)
        lines += [f"  {a} -> {b} (line {edges[a][b]})" for a in comp for b in sorted(edges[a]) if b in members]
    return "\n".join(lines)


def imports_running_up(edges, layers=LAYERS) -> list[tuple[str, str, int]]:
    return sorted((a, b, line) for a, targets in edges.items() for b, line in targets.items()
                  if layer_of(a, layers) < layer_of(b, layers))


def test_the_graph_reader_reports_a_known_circle_back_up_import_and_private_import(tmp_path):
    """A tiny synthetic tree with one circle of three (one link a function-level relative import), one import from
    a lower layer to a higher one, one `from X import _name` and one `X._name`: each is reported exactly."""
    files = {
        "low/__init__.py": "",
        "low/a.py": "from low import b\n",
        "low/b.py": "def f():\n    from .c import thing\n    return thing\n",
        "low/c.py": "import low.a\nfrom high.top import helper\nthing = 1\n",
        "low/leaf.py": "_secret = 1\nvalue = 2\n",
        "high/__init__.py": "",
        "high/top.py": "from low.leaf import _secret, value\nfrom low import leaf as L\n"
                       "def helper():\n    return L._secret + L.value\n",
        "high/clean.py": "import os\nfrom low.leaf import value\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    layers = (("low", (r"low(\..*)?$",)), ("high", (r"high(\..*)?$",)))
    modules, edges, private = read_imports(tmp_path, ("low", "high"))
    assert set(modules) == {"low", "low.a", "low.b", "low.c", "low.leaf", "high", "high.top", "high.clean"}
    assert strongly_connected(edges) == [["low.a", "low.b", "low.c"]]
    assert [(a, b) for a, b, _ in imports_running_up(edges, layers)] == [("low.c", "high.top")]
    assert private == [("high.top", "low.leaf", "_secret", 1), ("high.top", "low.leaf", "_secret", 4)]
    assert "low.b -> low.c (line 2)" in describe_circles(strongly_connected(edges), edges)


@functools.lru_cache(maxsize=1)
def repo_graph():
    return read_imports(REPO)


def test_at_most_two_import_circles():
    _, edges, _ = repo_graph()
    circles = strongly_connected(edges)
    assert len(circles) <= MAX_CIRCLES, (
        f"{len(circles)} import circles (target: at most {MAX_CIRCLES}):\n" + describe_circles(circles, edges))


def test_no_import_runs_back_up_the_layers():
    _, edges, _ = repo_graph()
    up = imports_running_up(edges)
    assert not up, f"{len(up)} imports from a lower layer to a higher one:\n" + "\n".join(
        f"  {a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]}), line {line}" for a, b, line in up)


def test_no_private_name_is_imported_across_modules():
    _, _, private = repo_graph()
    assert not private, f"{len(private)} imports of another module's _private name:\n" + "\n".join(
        f"  {a} line {line}: {b}.{name}" for a, b, name, line in private)
