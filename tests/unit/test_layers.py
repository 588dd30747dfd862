"""The order of the packages: each imports only the packages below it (docs/architecture.md,
"The layers").

Every import in the tree counts, also those inside functions (an extra loaded lazily) and
those only type checkers read: an arrow that runs back up is a layer in the wrong place, even
where it does not make a cycle yet.
"""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Lowest first. The shared format (client/format, installed as mariadb_cdc_client.format) is
# the ground floor under all of them: the service and the client library both speak it.
SERVER_LAYERS = ("core", "mariadb", "schema", "replication", "store", "messages", "dump",
                 "reread", "sinks", "protocol", "ops", "app")


def _imports(path: str) -> list[tuple[str, int]]:
    """Every module ``path`` imports (absolute names), with its line."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
            found += [(f"{node.module}.{a.name}", node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
    return found


def _modules(folder: str) -> list[str]:
    paths = []
    for directory, _, files in os.walk(os.path.join(ROOT, folder)):
        paths += [os.path.join(directory, f) for f in files if f.endswith(".py")]
    return sorted(paths)


def _layer_of(path: str) -> str | None:
    parts = os.path.relpath(path, os.path.join(ROOT, "cdcserver")).split(os.sep)
    return parts[0] if len(parts) > 1 else None


def test_every_server_package_has_a_layer():
    folders = {name for name in os.listdir(os.path.join(ROOT, "cdcserver"))
               if os.path.isfile(os.path.join(ROOT, "cdcserver", name, "__init__.py"))}
    assert folders == set(SERVER_LAYERS)


def test_each_server_package_imports_only_the_packages_below_it():
    rank = {name: i for i, name in enumerate(SERVER_LAYERS)}
    upward = []
    for path in _modules("cdcserver"):
        layer = _layer_of(path)
        for module, line in _imports(path):
            parts = module.split(".")
            if parts[0] != "cdcserver" or len(parts) < 2 or parts[1] not in rank:
                continue
            target = parts[1]
            if layer is None:  # cdcserver/__init__.py: the package's face, nothing under it
                upward.append(f"{os.path.relpath(path, ROOT)}:{line} imports {module}")
            elif target != layer and rank[target] > rank[layer]:
                upward.append(f"{os.path.relpath(path, ROOT)}:{line} ({layer}) imports "
                              f"{module} ({target}, a layer above)")
    assert sorted(set(upward)) == []


@pytest.mark.parametrize("folder", ["client/format"])
def test_the_shared_format_is_the_ground_floor(folder: str):
    """The format imports neither the service nor the rest of the client library."""
    wrong = [f"{os.path.relpath(path, ROOT)}:{line} imports {module}"
             for path in _modules(folder) for module, line in _imports(path)
             if module.startswith("cdcserver") or (module.startswith("mariadb_cdc_client")
                                                   and not module.startswith(
                                                       "mariadb_cdc_client.format"))]
    assert wrong == []


def test_the_client_library_never_imports_the_service():
    wrong = [f"{os.path.relpath(path, ROOT)}:{line} imports {module}"
             for path in _modules("client") for module, line in _imports(path)
             if module.split(".")[0] == "cdcserver"]
    assert wrong == []


def test_the_check_finds_an_arrow_that_runs_back_up(tmp_path):
    """The check itself: an import of the app from the store is reported."""
    module = tmp_path / "bad.py"
    module.write_text("def f():\n    from cdcserver.app.service import Service\n")
    assert ("cdcserver.app.service", 2) in _imports(str(module))


def _module_name(path: str, folder: str, package: str) -> str:
    relative = os.path.relpath(path, os.path.join(ROOT, folder))[:-3].replace(os.sep, ".")
    relative = relative.removesuffix("__init__").rstrip(".")
    return f"{package}.{relative}" if relative else package


def _loops(arrows: dict[str, set[str]]) -> list[list[str]]:
    """The import loops of ``arrows`` (module -> modules it imports): each strongly
    connected set of more than one module, found with a stack of its own (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops = []
    for start in sorted(arrows):
        if start in index:
            continue
        work = [(start, iter(sorted(arrows[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = stack[stack.index(node):]
                    del stack[stack.index(node):]
                    if len(members) > 1:
                        loops.append(sorted(members))
                continue
            if target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                work.append((target, iter(sorted(arrows[target]))))
            elif target in stack:
                low[node] = min(low[node], index[target])
    return loops


@pytest.mark.parametrize(("folder", "package"), [("cdcserver", "cdcserver"),
                                                 ("client", "mariadb_cdc_client")])
def test_no_module_imports_one_that_imports_it_back(folder: str, package: str):
    """No import loop between modules, even through an import inside a function or one only
    type checkers read (issue 51: three were left, adminview and service, capture and config,
    the Kafka sink and its metrics; each now declares what it reads of the other as a
    Protocol)."""
    paths = {_module_name(p, folder, package): p for p in _modules(folder)}
    arrows = {name: {m for m, _ in _imports(path) if m in paths and m != name}
              for name, path in paths.items()}
    assert _loops(arrows) == []


def test_the_loop_check_finds_a_loop():
    assert _loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _loops({"a": {"b"}, "b": set()}) == []
