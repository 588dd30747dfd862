"""The tree's structure holds: the service imports only the shared format from the client
side, the format loads nothing else, no module of the service imports itself back, and nothing
imports the client by its deprecated name."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
CLIENT = "mariadb_cdc_client"  # the import name of the folder client/ (pyproject.toml)
FOLDERS = {"cdcserver": ROOT / "cdcserver", CLIENT: ROOT / "client"}
OLD_CLIENT = "client"  # its name up to 0.1.0, a deprecated alias (client/_legacy)


def _sources(package: str) -> list[Path]:
    """The package's modules: not the alias in client/_legacy, which is not part of it."""
    folder = FOLDERS[package]
    return [p for p in folder.rglob("*.py") if "_legacy" not in p.relative_to(folder).parts]


def _module_name(path: Path) -> str:
    package, folder = next((n, f) for n, f in FOLDERS.items() if path.is_relative_to(f))
    parts = (package, *path.relative_to(folder).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """What a module imports anywhere in it (a function-level import is still a
    dependency), except under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _graph(package: str) -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in _sources(package)}
    # a module's own packages are not dependencies: Python imports them first anyway
    return {name: {m for m in _imports(path) if m in modules and m != name
                   and not name.startswith(m + ".")}
            for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_module_of_the_service_or_the_client_imports_itself_back():
    assert _cycles(_graph("cdcserver")) == []
    client = _graph(CLIENT)
    assert client[f"{CLIENT}.spark.source"] >= {f"{CLIENT}.sync", f"{CLIENT}.format.names"}
    assert _cycles(client) == []


def test_the_services_packages_depend_on_each_other_one_way():
    """core, mariadb, store, ... app: a package never imports one that imports it back."""
    modules = _graph("cdcserver")
    packages: dict[str, set[str]] = {}
    for name, imported in modules.items():
        home = name.split(".")[1] if name.count(".") else name
        packages.setdefault(home, set()).update(
            m.split(".")[1] for m in imported if m.count(".") and m.split(".")[1] != home)
    assert _cycles({p: {i for i in deps if i in packages} for p, deps in packages.items()}) \
        == []


def _outside_the_format(module: str) -> bool:
    """The client (by either name), or a module of it, other than its format."""
    top, _, rest = module.partition(".")
    return top in (CLIENT, OLD_CLIENT) and rest.split(".")[0] != "format"


def test_the_service_imports_only_the_shared_format_from_the_client():
    imported = {_module_name(path): _imports(path) for path in _sources("cdcserver")}
    assert any(m.startswith(f"{CLIENT}.format.") for m in imported["cdcserver.core.gtid"])
    offending = {name: sorted(filter(_outside_the_format, modules))
                 for name, modules in imported.items() if any(map(_outside_the_format, modules))}
    assert offending == {}


def test_nothing_imports_the_client_by_its_deprecated_name():
    """``client`` is an alias kept for users; here, with the repository on sys.path, it would
    load the folder client/ as a second copy of the library (and warn nowhere)."""
    offending = []
    for folder in ("cdcserver", "client", "tests", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            if "_legacy" in path.parts:
                continue
            old = sorted(m for m in _imports(path) if m.split(".")[0] == OLD_CLIENT)
            if old:
                offending.append(f"{path.relative_to(ROOT)}: {', '.join(old)}")
    assert offending == []


def test_the_shared_format_loads_nothing_but_itself():
    code = ("import sys, pkgutil, importlib, cdcserver\n"
            "for m in pkgutil.walk_packages(cdcserver.__path__, 'cdcserver.'):\n"
            "    importlib.import_module(m.name)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {(CLIENT, OLD_CLIENT)}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    loaded = eval(out)  # a printed list of module names
    assert f"{CLIENT}.format.wire" in loaded
    # the package itself is loaded, as the format's parent: its names load when first used
    assert [m for m in loaded if _outside_the_format(m) and m not in (CLIENT, OLD_CLIENT)] == []
    for path in (ROOT / "client" / "format").glob("*.py"):
        imported = {m.split(".")[0] for m in _imports(path)}
        # cramjam: the snappy and zstd block codecs, bytes to bytes
        assert imported <= set(sys.stdlib_module_names) | {CLIENT, "cramjam"}, (path, imported)


_DATA_DIR_NAMES = {"avro", "dump", "state", "checkpoint.json", "checkpoint.log",
                   "index.sqlite", "views.sqlite", "schema_history.jsonl", "kafka.json",
                   "writer.lock", ".room-probe", "resync"}


def test_only_the_layout_names_the_data_directorys_paths():
    """Every path into the data directory comes from cdcserver/store/layout.py."""
    offending = []
    for path in (ROOT / "cdcserver").rglob("*.py"):
        if path.name == "layout.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "os.path.join":
                literals = {a.value for a in node.args if isinstance(a, ast.Constant)}
                if literals & _DATA_DIR_NAMES:
                    offending.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            elif isinstance(node, ast.JoinedStr) and any(
                    isinstance(v, ast.Constant) and str(v.value).strip("/") in _DATA_DIR_NAMES
                    for v in node.values):
                offending.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offending == []
