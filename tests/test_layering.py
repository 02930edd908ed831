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
    assert users == ["tasks/validation.py"]


def test_config_modules_are_leaves():
    """mlm_core.config and its config_* section modules import only pydantic, the effect markers, the language
    table and each other (so every layer can import the config without pulling in the rest of the project)."""
    allowed = {"mlm_core.effects", "mlm_core.languages"}
    offenders = {}
    for p in sorted((REPO / "mlm_core").glob("config*.py")):
        if p.name == "configio.py":
            continue
        tree = ast.parse(p.read_text(encoding="utf-8"))
        mods = ({n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
                | {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names})
        mods = {m for m in mods if m.split(".")[0] == "mlm_core"}
        bad = sorted(m for m in mods if m not in allowed and not m.startswith("mlm_core.config_"))
        if bad:
            offenders[p.name] = bad
    assert not offenders, offenders
