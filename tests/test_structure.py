"""The house's shape, for every room and the front (humanset/, catalog/, explore/, pipeline/, render/, training/):

- no import circle between our modules, counting imports at any depth (a deferred import inside a
  function hides a circle from Python, not from this test) and the stage registry's "module:Class"
  strings;
- pipeline/, render/ and training/ import catalog/ only (never each other, never the humanset front);
  catalog/ imports nothing else of ours;
- no module over MAX_LINES lines unless its top docstring has a line starting "Size:" that says why;
- no folder of these packages holds more than MAX_MODULES modules side by side (a concern is a folder);
- no module but a package's __init__.py re-exports: it imports no name of ours that it does not use,
  and lists none in `__all__` (import a name from the module that defines it);
- bench/ holds benchmarks, no experiment, and its scripts import one another without a circle; nothing in
  the product, tests/, bench/ or scripts/ imports research/ (experiments and lab notes, kept apart).

The known exceptions are listed below, each with its reason, and printed by the tests (`pytest -s`, or
in the report of a failure). An entry that is no longer needed fails the test too, so the lists only
shrink. Imports by a computed name (`importlib.import_module(f".{name}")`) are not seen.
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("humanset", "catalog", "explore", "pipeline", "render", "training")
ROOMS = ("explore", "pipeline", "render", "training")  # each may import catalog/ only
MAX_LINES = 400
MAX_MODULES = 20  # modules side by side in one folder (its __init__.py not counted)

# modules over MAX_LINES with no written reason, while a split is pending (issue #22): none left
# (pipeline/dedup/clusters.py and render/run/job.py were the last)
OVERSIZED_ALLOWED: dict[str, str] = {}
# import circles, each closed by a deferred import or a re-export: none left
CIRCLES_ALLOWED: dict[frozenset, str] = {}

# files that name research/ without loading code from it
READS_RESEARCH = {"tests/test_docs_links.py": "checks the links of research/**/*.md, as of docs/"}

_REGISTRY_STRING = re.compile(r"^([a-z_]+(?:\.[a-z_0-9]+)+):\w+$")  # "pipeline.stages.decode:DecodeStage"


def module_files() -> dict[str, Path]:
    """dotted module name -> file, for every module of our packages (a package is its __init__.py)."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ours that module `name` imports, anywhere in its file."""
    is_package = path.name == "__init__.py"
    here = name if is_package else name.rpartition(".")[0]  # the package relative imports start from
    found = set()

    def add(target: str, names=()):
        # `from a import b`: a itself, or a.b where b is a module (then a's __init__ runs too, but it is
        # already initialising when a module inside it is imported, so it is no edge of a circle)
        subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in known]
        found.update(subs)
        if len(subs) < len(names) or not names:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target:
                found.add(target)

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target.split(".")[0] in PACKAGES:
                add(target, [a.name for a in node.names if a.name != "*"])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in PACKAGES:
                    add(a.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = _REGISTRY_STRING.match(node.value)
            if m and m.group(1) in known:
                found.add(m.group(1))
    found.discard(name)
    return found


@functools.cache
def import_graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: _imports(name, path, set(files)) for name, path in files.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """The circles: Tarjan's strongly connected components of more than one module (or a self-loop)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def room_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for name, targets in sorted(graph.items()):
        room = name.split(".")[0]
        allowed = {room, "catalog"} if room in ROOMS else {"catalog"} if room == "catalog" else set(PACKAGES)
        out += [f"{name} imports {t}" for t in sorted(targets) if t.split(".")[0] not in allowed]
    return out


def _size_reason(path: Path) -> str | None:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return next((line.strip() for line in doc.splitlines() if line.strip().startswith("Size:")), None)


def oversized() -> dict[str, int]:
    """relative path -> lines, for each module over MAX_LINES without a "Size:" line in its docstring."""
    out = {}
    for path in module_files().values():
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES and _size_reason(path) is None:
            out[path.relative_to(ROOT).as_posix()] = lines
    return out


def crowded_folders(root: Path = ROOT, packages=PACKAGES) -> dict[str, int]:
    """relative folder -> modules side by side, for each folder of the packages over MAX_MODULES."""
    out = {}
    for package in packages:
        for folder in [root / package, *(d for d in sorted((root / package).rglob("*")) if d.is_dir())]:
            n = sum(1 for f in folder.glob("*.py") if f.name != "__init__.py")
            if n > MAX_MODULES:
                out[folder.relative_to(root).as_posix()] = n
    return out


def _annotation_names(tree: ast.AST) -> set[str]:
    """Names used in string annotations (`-> "Unit"`), which ast sees as constants."""
    out = set()
    for node in ast.walk(tree):
        anns = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            anns = [a.annotation for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg)
                    if a is not None] + [node.returns]
        elif isinstance(node, ast.AnnAssign):
            anns = [node.annotation]
        for ann in anns:
            for sub in ast.walk(ann) if ann is not None else ():
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    out.update(re.findall(r"[A-Za-z_]\w*", sub.value))
    return out


def re_exported(path: Path, packages=PACKAGES) -> list[str]:
    """The names of ours a module passes on without using: imported and not used, or listed in `__all__`
    while imported (empty for a package's __init__.py, the one place that may re-export)."""
    if path.name == "__init__.py":
        return []
    tree = ast.parse(path.read_text(), filename=str(path))
    imported: dict[str, str] = {}  # bound name -> what it is
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in packages:
            imported.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names if a.name != "*"})
        elif isinstance(node, ast.ImportFrom) and node.level:
            imported.update({a.asname or a.name: f"{'.' * node.level}{node.module or ''}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            imported.update({a.asname or a.name.split(".")[0]: a.name for a in node.names
                             if a.name.split(".")[0] in packages})
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | _annotation_names(tree)
    listed = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
            listed |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return sorted(f"{name} ({what}){' in __all__' if name in listed else ', not used'}"
                  for name, what in imported.items() if name in listed or name not in used)


def re_exports() -> dict[str, list[str]]:
    out = {}
    for path in module_files().values():
        found = re_exported(path)
        if found:
            out[path.relative_to(ROOT).as_posix()] = found
    return out


def test_the_new_checks_find_what_they_look_for(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for i in range(MAX_MODULES + 1):
        (pkg / "sub" / f"m{i}.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    assert crowded_folders(tmp_path, ("pkg",)) == {"pkg/sub": MAX_MODULES + 1}
    (pkg / "sub" / "m0.py").unlink()
    assert crowded_folders(tmp_path, ("pkg",)) == {}

    mod = pkg / "mod.py"
    mod.write_text('from catalog.io import commit, tmp_name\nfrom catalog import storage as st\nimport json\n'
                   'from pipeline.inputs.units import Unit\n__all__ = ["commit", "helper"]\n'
                   'def helper(u: "Unit") -> None:\n    commit(json.dumps(u))\n')
    assert re_exported(mod) == ["commit (catalog.io.commit) in __all__", "st (catalog.storage), not used",
                                "tmp_name (catalog.io.tmp_name), not used"]
    mod.write_text('from catalog.io import commit\nimport catalog.storage\nfrom . import sibling\n'
                   'def f():\n    return commit, catalog.storage.is_uri, sibling\n')
    assert re_exported(mod) == []
    init = pkg / "__init__.py"
    init.write_text('from catalog.io import commit\n__all__ = ["commit"]\n')
    assert re_exported(init) == []  # the one place a name may be passed on


def test_the_checks_find_what_they_look_for(tmp_path):
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert strongly_connected({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []
    assert room_violations({"pipeline.x": {"catalog.io", "pipeline.y", "render.run.job"},
                            "catalog.io": {"training.mae"}, "humanset.cli": {"render.run.job"}}) == [
        "catalog.io imports training.mae", "pipeline.x imports render.run.job"]
    # a deferred relative import inside a function is an edge, as are `from . import x` and registry strings
    pkg = tmp_path / "pkg.py"
    pkg.write_text('def f():\n    from . import isolate\n    from .adapter import run\n'
                   'X = "pipeline.stages.decode:DecodeStage"\nlog = "pipeline.engine.isolate"\n')
    known = {"pipeline", "pipeline.engine.isolate", "pipeline.engine.adapter", "pipeline.stages", "pipeline.stages.decode"}
    assert _imports("pipeline.engine.driver", pkg, known) == {"pipeline.engine.isolate", "pipeline.engine.adapter",
                                                        "pipeline.stages.decode"}
    big = tmp_path / "big.py"
    big.write_text('"""A module.\n\nSize: one table of 500 constants, split it and it reads worse.\n"""\n')
    assert _size_reason(big).startswith("Size: one table")
    big.write_text('"""A module."""\n')
    assert _size_reason(big) is None


def test_the_graph_sees_every_room():
    graph = import_graph()
    assert set(PACKAGES) <= set(graph) and len(graph) > 100
    assert "pipeline.stages.person" in graph["pipeline.stages"]  # through the registry's strings
    assert {"pipeline.demo.crawl", "render.demo_renders", "training.pretrain"} <= graph["humanset.demo"]  # deferred imports
    assert "pipeline.engine.unit_io" in graph["pipeline.engine.isolate"]
    assert "training.trainer" in graph["training.pretrain"] and "training.trainer" in graph["training.tasks.finetune"]


def test_no_import_circle():
    circles = strongly_connected(import_graph())
    print("import circles allowed for now:", {" <-> ".join(sorted(c)): r for c, r in CIRCLES_ALLOWED.items()})
    new = [" -> ".join(sorted(c)) for c in circles if frozenset(c) not in CIRCLES_ALLOWED]
    assert not new, f"import circles (a deferred import inside a function counts): {new}"
    gone = [" <-> ".join(sorted(c)) for c in CIRCLES_ALLOWED if c not in [frozenset(x) for x in circles]]
    assert not gone, f"these circles are gone: remove them from CIRCLES_ALLOWED in {__file__}: {gone}"


def test_rooms_import_only_catalog():
    bad = room_violations(import_graph())
    assert not bad, "pipeline/, render/ and training/ may import catalog/ only, catalog/ nothing else: " + \
        "; ".join(bad)


def test_no_oversized_module_without_a_reason():
    found = oversized()
    print(f"modules over {MAX_LINES} lines allowed for now:",
          {n: f"{found.get(n, '?')} lines, {r}" for n, r in OVERSIZED_ALLOWED.items()})
    new = {n: s for n, s in found.items() if n not in OVERSIZED_ALLOWED}
    assert not new, (f"modules over {MAX_LINES} lines: {new}; split them, or say why at the top of the "
                     "module's docstring in a line starting 'Size:'")
    stale = sorted(set(OVERSIZED_ALLOWED) - set(found))
    assert not stale, f"no longer oversized: remove them from OVERSIZED_ALLOWED in {__file__}: {stale}"


def test_no_folder_holds_more_than_max_modules():
    crowded = crowded_folders()
    assert not crowded, (f"folders with more than {MAX_MODULES} modules side by side: {crowded}; "
                         "group them by concern into sub-packages")


def test_no_re_export_outside_a_package_init():
    found = re_exports()
    assert not found, ("modules that pass on names of ours (import each from the module that defines it; "
                       f"only a package's __init__.py re-exports): {found}")


def _top_names(node: ast.AST) -> set[str]:
    """The top-level module names an import statement names (none for a relative import)."""
    if isinstance(node, ast.Import):
        return {a.name.split(".")[0] for a in node.names}
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return {node.module.split(".")[0]}
    return set()


def _script_imports(path: Path) -> set[str]:
    """Top-level module names a script imports (bench/ scripts import their neighbours by bare name)."""
    return set().union(*map(_top_names, ast.walk(ast.parse(path.read_text(), filename=str(path)))))


def research_uses(path: Path) -> list[str]:
    """How a file reaches into research/: an import of it, or a path naming it ("research", "research/x.py")."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if "research" in _top_names(node):
            found.append(f"imports research (line {node.lineno})")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                node.value == "research" or re.fullmatch(r"research/\S+\.py", node.value)):
            found.append(f"names {node.value!r} (line {node.lineno})")
    return found


def test_bench_holds_benchmarks_without_a_circle():
    scripts = {p.stem: p for p in sorted((ROOT / "bench").glob("*.py"))}
    neighbours = set(scripts) - set(PACKAGES)  # bench/render.py's `render` is the package when imported
    graph = {name: _script_imports(path) & neighbours - {name} for name, path in scripts.items()}
    assert not strongly_connected(graph), f"bench/ import circles: {strongly_connected(graph)}"
    experiments = [n for n, p in scripts.items()
                   if (ast.get_docstring(ast.parse(p.read_text())) or "").startswith("Experiment")]
    assert not experiments, f"experiments belong in research/, not bench/: {experiments}"


def test_nothing_imports_research(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""See research/notes/x.md."""\nimport research.watermark\nP = ROOT / "research"\n'
                     'Q = "research/watermark/tile.py"\n')
    assert sorted(u.split(" (")[0] for u in research_uses(probe)) == [
        "imports research", "names 'research'", "names 'research/watermark/tile.py'"]
    files = [p for d in (*PACKAGES, "tests", "bench", "scripts") for p in sorted((ROOT / d).rglob("*.py"))]
    found = {name: u for p in files if p != Path(__file__) and (name := p.relative_to(ROOT).as_posix())
             not in READS_RESEARCH and (u := research_uses(p))}
    assert not found, f"research/ is not part of the product: nothing may import or load it: {found}"
