"""The import graph of kts_resources and kts_assets: the layers the architecture promises (issue 32).

* ``kts_resources/kafka/`` is the format core: it imports only itself, the standard library and
  the libraries Kafka's formats need (CRC-32C, the codecs, Arrow for the columnar decoder). Its
  ``simulator/`` (a broker-like writer for demos and tests) may use the rest of kafka/; nothing
  else in kafka/ uses the simulator.
* kts_resources is the procedures, free of the orchestrator: nothing in it imports kts_assets or
  Dagster, except the Dagster resources module and the instance-storage adapters named below.
* Dagster's private API (``dagster._core``) is used in two adapters, each saying why it has no
  public road: ``kts_assets.dagster_internals`` (the pipeline's uses) and
  ``kts_resources.dagster_event_log`` (a subclass of Dagster's PostgreSQL event log, whose tables
  are Dagster's).
* The metadata layer sits below the tiering rules: nothing in ``metadata/`` imports ``tiering/``.
* No import cycles among kts modules.

The graph is built from the source with ``ast``, not by importing it: every ``import`` counts,
including those inside functions and under ``TYPE_CHECKING`` (a deferred import still ties the two
modules together), relative ones resolved. A package's ``__init__`` is a module of its own:
``from pkg import name`` depends on ``pkg/__init__.py`` unless ``pkg.name`` is a module.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KTS_PACKAGES = ("kts_assets", "kts_resources")

# Third-party libraries the format core may use, each for a format it reads or writes.
FORMAT_LIBRARIES = {
    "crc32c": "CRC-32C of record batches and snapshots",
    "cramjam": "the snappy codec",
    "lz4": "the lz4 codec",
    "zstandard": "the zstd codec",
    "numpy": "the columnar record decoder",
    "pyarrow": "the columnar record decoder's tables",
}

# The only modules of kts_resources that may import Dagster (or a dagster_* package).
DAGSTER_ADAPTERS = {
    "kts_resources.resources": "the Dagster resources the pipeline is given",
    "kts_resources.dagster_storage": "Dagster's run storage on kts's own PostgreSQL, named in dagster.yaml "
                                     "(a Dagster class by contract)",
    "kts_resources.dagster_event_log": "the event log of that storage, a run's bookkeeping batched "
                                       "(a Dagster class by contract)",
}

# The only modules that may import Dagster's private API (``dagster._core``).
PRIVATE_API_ADAPTERS = {
    "kts_assets.dagster_internals": "what the pipeline needs that Dagster 1.13 has no public road for",
    "kts_resources.dagster_event_log": "a subclass of Dagster's PostgreSQL event log: its tables are Dagster's",
}


@dataclass(frozen=True)
class Import:
    """One import statement's target, where it is written."""

    importer: str
    imported: str  # a kts module, or the full dotted name of anything else
    line: int

    def __str__(self) -> str:
        return f"{self.importer} (line {self.line}) imports {self.imported}"


def kts_modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Every module of ``packages`` under ``root`` by its dotted name (a package by its own)."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imports(root: Path, packages: tuple[str, ...]) -> list[Import]:
    """Every import written in ``packages``, resolved to the module it loads."""
    modules = kts_modules(root, packages)
    found = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                # ``from pkg import sub`` loads the module pkg.sub when there is one, else pkg itself.
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            else:
                continue
            found += [Import(name, _owning_module(target, modules), node.lineno) for target in targets]
    return found


def _owning_module(target: str, modules: dict[str, Path]) -> str:
    """The kts module ``import target`` runs (``a.b.name`` → ``a.b``), or ``target`` when not kts's."""
    name = target
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name if name in modules else target


def import_cycles(root: Path, packages: tuple[str, ...]) -> list[list[str]]:
    """The import cycles among the modules of ``packages``: each strongly connected component of
    their import graph with more than one module (or a module importing itself), sorted."""
    modules = kts_modules(root, packages)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for edge in imports(root, packages):
        if edge.imported in modules:
            graph[edge.importer].add(edge.imported)
    return sorted(sorted(c) for c in _strongly_connected(graph) if len(c) > 1 or next(iter(c)) in graph[next(iter(c))])


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative (the graph is deep enough to matter for recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    components.append(component)
    return components


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _top(name: str) -> str:
    return name.split(".")[0]


KTS_IMPORTS = imports(REPO, KTS_PACKAGES)
KAFKA = "kts_resources.kafka"
SIMULATOR = "kts_resources.kafka.simulator"


def test_the_kafka_format_core_imports_only_itself_the_standard_library_and_format_libraries():
    allowed = set(sys.stdlib_module_names) | set(FORMAT_LIBRARIES)
    leaks = [str(i) for i in KTS_IMPORTS if _in(i.importer, KAFKA) and not _in(i.importer, SIMULATOR)
             and not _in(i.imported, KAFKA) and _top(i.imported) not in allowed]
    assert leaks == []


def test_the_kafka_simulator_imports_only_kafka_the_standard_library_and_format_libraries():
    allowed = set(sys.stdlib_module_names) | set(FORMAT_LIBRARIES)
    leaks = [str(i) for i in KTS_IMPORTS if _in(i.importer, SIMULATOR)
             and not _in(i.imported, KAFKA) and _top(i.imported) not in allowed]
    assert leaks == []


def test_nothing_in_kafka_outside_the_simulator_imports_the_simulator():
    leaks = [str(i) for i in KTS_IMPORTS if _in(i.importer, KAFKA) and not _in(i.importer, SIMULATOR)
             and _in(i.imported, SIMULATOR)]
    assert leaks == []


def test_kts_resources_imports_neither_kts_assets_nor_dagster_but_in_its_named_adapters():
    leaks = [str(i) for i in KTS_IMPORTS if _in(i.importer, "kts_resources") and i.importer not in DAGSTER_ADAPTERS
             and (_in(i.imported, "kts_assets") or _top(i.imported) == "dagster" or _top(i.imported).startswith("dagster_"))]
    assert leaks == []


def test_the_named_adapters_are_modules_that_exist():
    # An adapter renamed or deleted must leave this list, not linger as a stale exception.
    assert set(DAGSTER_ADAPTERS) <= set(kts_modules(REPO, ("kts_resources",)))
    assert set(PRIVATE_API_ADAPTERS) <= set(kts_modules(REPO, KTS_PACKAGES))


def test_only_the_named_adapters_import_dagsters_private_api():
    leaks = [str(i) for i in KTS_IMPORTS if _in(i.imported, "dagster._core") and i.importer not in PRIVATE_API_ADAPTERS]
    assert leaks == []


def test_the_metadata_layer_imports_nothing_of_the_tiering_rules():
    leaks = [str(i) for i in KTS_IMPORTS if _in(i.importer, "kts_resources.metadata")
             and _in(i.imported, "kts_resources.tiering")]
    assert leaks == []


def test_kts_modules_import_one_another_without_cycles():
    cycles = import_cycles(REPO, KTS_PACKAGES)
    assert cycles == [], "\n".join("modules importing one another in a cycle: " + ", ".join(cycle) for cycle in cycles)


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root


def test_the_cycle_finder_reports_a_planted_cycle_through_an_import_inside_a_function(tmp_path):
    root = _package(tmp_path, {
        "planted/__init__.py": "",
        "planted/log.py": "from .index import lookup\n",
        "planted/index/__init__.py": "",
        "planted/index/lookup.py": "def find():\n    from planted import log\n    return log\n",
        "planted/bystander.py": "import planted.log\n",
    })
    assert import_cycles(root, ("planted",)) == [["planted.index.lookup", "planted.log"]]


def test_the_cycle_finder_counts_a_package_init_as_a_module(tmp_path):
    root = _package(tmp_path, {
        "planted/__init__.py": "from planted.segment import Segment\n",
        "planted/segment.py": "from planted import DEFAULT_SIZE\n",
    })
    assert import_cycles(root, ("planted",)) == [["planted", "planted.segment"]]


def test_the_cycle_finder_reports_a_module_importing_itself_and_nothing_where_imports_only_go_down(tmp_path):
    looped = _package(tmp_path / "looped", {"planted/__init__.py": "", "planted/log.py": "from . import log\n"})
    layered = _package(tmp_path / "layered", {
        "planted/__init__.py": "",
        "planted/records.py": "import struct\n",
        "planted/segment.py": "from .records import scan\n",
        "planted/log.py": "from planted.segment import Segment\nfrom planted import records\n",
    })
    assert import_cycles(looped, ("planted",)) == [["planted.log"]]
    assert import_cycles(layered, ("planted",)) == []
