"""docs/architecture.md is held to the code: it names every module of grpokit/, rewards/ and labs/ (and launch.py),
nothing that does not exist, and its floors are the import order: a room imports only rooms on its floor or below
(imports inside functions counted), and no two rooms import each other back."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from helpers import ROOT
from test_layout import find_cycle, import_graph, project_modules

PAGE = ROOT / "docs" / "architecture.md"
OPENED = {"grpokit"}  # a package the page opens room by room: its own (empty) face is no room
FLOOR = re.compile(r"^### (\d+)\. ")
ROOM = re.compile(r"^- `([\w./]+)`")
MEMBER = re.compile(r"^  - ")  # a line under a package's line names modules of that package


def read_page(text: str) -> dict[str, tuple[int, set[str]]]:
    """The page's rooms under "## The floors": path -> (floor, the module files a package's line and the lines
    under it name)."""
    rooms, floor, inside, path = {}, None, False, None
    for line in text.splitlines():
        if line.startswith("## "):
            inside = line == "## The floors"
            continue
        if not inside:
            continue
        if m := FLOOR.match(line):
            floor, path = int(m.group(1)), None
        elif (m := ROOM.match(line)) and floor is not None:
            path = m.group(1)
            members = {path + name for name in re.findall(r"`(\w+\.py)`", line)} if path.endswith("/") else set()
            assert path not in rooms, f"docs/architecture.md names {path} twice"
            rooms[path] = (floor, members)
        elif MEMBER.match(line) and path and path.endswith("/"):
            rooms[path][1].update(path + name for name in re.findall(r"`(\w+\.py)`", line.split(" — ")[0]))
        elif line.strip():
            path = None
    return rooms


def tree() -> dict[str, str]:
    """Every module of the tree as the page names it (a package's face by its folder), mapped to its module name."""
    out = {}
    for name, path in project_modules().items():
        if name in OPENED:
            continue
        rel = path.relative_to(ROOT).as_posix()
        out[rel[: -len("__init__.py")] if path.name == "__init__.py" else rel] = name
    return out


def room_of(rel: str, rooms: dict) -> str | None:
    """The room a module stands in: its own line, or the deepest package line whose folder holds it."""
    if rel in rooms:
        return rel
    folders = [r for r in rooms if r.endswith("/") and rel.startswith(r)]
    return max(folders, key=len) if folders else None


@pytest.fixture(scope="module")
def rooms():
    return read_page(PAGE.read_text())


def test_the_page_names_every_module_and_nothing_else(rooms):
    named = set(rooms) | {m for _, members in rooms.values() for m in members}
    modules = set(tree())
    missing = sorted(modules - named)
    assert not missing, f"docs/architecture.md does not name {missing}: give each a line (or a mention on its package's line) on its floor"
    unknown = sorted(named - modules)
    assert not unknown, f"docs/architecture.md names {unknown}, which the tree does not hold"
    # a package's line names the modules directly in its folder; one in a subpackage is named on that subpackage's line
    for path, (_, members) in rooms.items():
        for member in members:
            assert room_of(member, rooms) == path, f"{member} is named on {path}'s line but stands in {room_of(member, rooms)}"


def room_graph(rooms: dict) -> dict[str, set[str]]:
    names = {name: rel for rel, name in tree().items()}
    graph: dict[str, set[str]] = {}
    for name, targets in import_graph().items():
        if name in OPENED:
            continue
        here = room_of(names[name], rooms)
        graph.setdefault(here, set())
        for target in targets:
            if target in OPENED or target not in names:
                continue
            there = room_of(names[target], rooms)
            if there != here:
                graph[here].add(there)
    return graph


def arrows_up(rooms: dict, graph: dict[str, set[str]]) -> list[str]:
    return [f"{a} (floor {rooms[a][0]}) imports {b} (floor {rooms[b][0]})"
            for a, targets in sorted(graph.items()) for b in sorted(targets) if rooms[b][0] > rooms[a][0]]


def test_every_room_imports_only_its_floor_or_below(rooms):
    upward = arrows_up(rooms, room_graph(rooms))
    assert not upward, "docs/architecture.md's floors and the imports disagree, arrows that point up:\n" + "\n".join(upward)


def test_no_room_imports_one_that_imports_it_back(rooms):
    cycle = find_cycle(room_graph(rooms))
    assert cycle is None, f"rooms that import each other back: {' -> '.join(cycle)}"


def test_the_checks_catch_a_page_out_of_step():
    # A check that cannot fail proves nothing: an importer put below what it imports, a package line's modules.
    page = read_page("## The floors\n### 2. Up\n- `a/` — x: `b.py`, `Field`\n  - `f.py`, `g.py` — z, not `h.py`\n"
                     "### 1. Down\n- `c.py` — y\n  - `e.py` — a file of no package's\n## Next\n- `d.py`")
    assert page == {"a/": (2, {"a/b.py", "a/f.py", "a/g.py"}), "c.py": (1, set())}
    assert arrows_up(page, {"c.py": {"a/"}, "a/": {"c.py"}}) == ["c.py (floor 1) imports a/ (floor 2)"]
    assert room_of("a/b.py", page) == "a/" and room_of("e.py", page) is None


def packages() -> list[str]:
    """grpokit's packages (the folders of `grpokit/` with a face)."""
    return sorted(name for name, path in project_modules().items()
                  if name.startswith("grpokit.") and path.name == "__init__.py")


def offered(package: str) -> set[str]:
    """The modules of `package` that modules outside it import: what its face must say it offers."""
    inside = package + "."
    return {target.removeprefix(inside) for name, targets in import_graph().items() if not name.startswith(inside)
            and name != package for target in targets if target.startswith(inside)}


def face_offers(doc: str, package: str) -> set[str]:
    """The package's modules its face's "Offers:" paragraph names."""
    modules = {name.rpartition(".")[2] for name in project_modules() if name.startswith(package + ".")}
    para = doc.split("Offers:", 1)[1].split("\n\n", 1)[0].split("Never:", 1)[0]
    return set(re.findall(r"`(\w+)`", para)) & modules


@pytest.mark.parametrize("package", packages())
def test_every_package_has_a_face_that_says_what_it_offers_and_never_does(package):
    doc = ast.get_docstring(ast.parse(project_modules()[package].read_text())) or ""
    assert len(doc.splitlines()) >= 3, f"{package.replace('.', '/')}/__init__.py: its face says in a few lines what the package is for"
    assert "Offers:" in doc and "Never:" in doc, f"{package.replace('.', '/')}/__init__.py: its face says what it offers and must never do"
    assert face_offers(doc, package) == offered(package), (
        f"{package}'s face offers {sorted(face_offers(doc, package))}; the rest of the code imports "
        f"{sorted(offered(package))} of it")


def test_grpokit_has_few_loose_modules():
    loose = sorted(p.name for p in (ROOT / "grpokit").glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= 8, f"grpokit/ holds {loose} loose: a capability's modules go into its package"


CORPORA = {"bad_recipes", "hostile"}  # folders of inputs the tests read, not tests


def test_the_tests_folders_mirror_the_house():
    homes = {p.name for p in (ROOT / "grpokit").iterdir() if (p / "__init__.py").exists()} | {"rewards", "labs"}
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    stray = sorted(folders - homes - CORPORA)
    assert not stray, f"tests/ has folders {stray} that mirror no package of grpokit/ (nor rewards/, labs/)"
