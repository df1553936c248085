#!/usr/bin/env python3
"""Fails on a cycle among a crate's modules, or on an edge the layering forbids.

Between the workspace's crates Cargo keeps the layers (a crate names only those it depends
on). Inside each crate this check does: for each crate's `src/` (`crates/*/src/`, and the
root's `src/` but `main.rs`, `cli.rs` and `alloc.rs`, the binary's), it reads every
`**/*.rs` (not tests' crates), collects the
module paths each file names (`crate::a::b`, and `self::`/`super::` paths read from the module
they are written in, an inline `mod tests` included; in `use` lines, `use …::{…}` groups and
inline paths),
and builds two graphs: one between the top-level modules (`http`, `pipeline`, `fleet`, …)
and, inside every folder, one between its sibling modules. A strongly connected component of
more than one module in either is a cycle; each is printed with one path per edge that makes it.

Besides cycles, the top-level graph keeps two rules of the layering (the tables `ONLY` and
`NEVER` below). A leaf is a module at the crate root, a file beside `lib.rs`, that names no
other module of the crate (`address`, `calendar`, `seconds`, …); any module may name
one. `config` names no other module than leaves and `reasoning`, `wire` and `runtime`: it is the config
model, and what it describes (of counting, say) is its own, not borrowed from the layer that
acts on it. `observe` names no `tokens`: the label values it records and the estimator its
record feeds are its own types. Each edge that breaks a rule is printed with a path that makes it.
Exit code 1 on a cycle or a broken rule, 0 otherwise. `--self-test` runs the check on small
trees made for it (a loop of `super::` paths must be found).
"""
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOT = REPO / "src"
SKIP = {"main.rs", "cli.rs", "alloc.rs"}

# A top-level module -> the only other folders it may name (leaves it may name always).
# config's model still holds types of reasoning (think tags, the reasoning field) and wire
# (the API, the converter, an alias's shape), and reads a flavour's runtime (which `"auto"`
# figures it reports); a new edge out of config is a leak.
ONLY = {"config": {"reasoning", "wire", "runtime"}}
# A top-level module -> the modules it must not name.
NEVER = {"observe": {"tokens"}}


def module_of(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return parts


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


PREFIX = r"\b(?:crate|self|super)(?:::super)*"


def expand_use_groups(text: str) -> list[tuple[int, str]]:
    """`crate::{a::b, c::{d, e}}` -> ["crate::a::b", "crate::c::d", "crate::c::e"], likewise for
    `self::{…}` and `super::{…}`, each with where it stands in the text."""
    out = []
    for m in re.finditer(PREFIX + r"::\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        prefix = m.group(0)[: -len("::{")]
        out.extend((m.start(), p) for p in _flatten(prefix, text[m.end() : i - 1]))
    return out


def _flatten(prefix: str, body: str) -> list[str]:
    items, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    items.append(cur)
    out = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        if "{" in item:
            head, rest = item.split("{", 1)
            out.extend(_flatten(f"{prefix}::{head.strip().rstrip(':')}", rest.rsplit("}", 1)[0]))
        else:
            out.append(f"{prefix}::{item.split(' as ')[0].strip()}")
    return out


def inline_modules(text: str) -> list[tuple[int, int, str]]:
    """The `mod name { … }` blocks of a file: where each opens and closes, and its name."""
    out = []
    for m in re.finditer(r"\bmod\s+([A-Za-z_][A-Za-z0-9_]*)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        out.append((m.start(), i, m.group(1)))
    return out


def resolve(me: list[str], at: int, path: str, inline: list[tuple[int, int, str]]) -> list[str] | None:
    """The crate path `path` names, written at `at` in the file of module `me`: `self::` and
    `super::` are read from the module they are written in (an inline `mod tests` included)."""
    parts = path.split("::")
    if parts[0] == "crate":
        return parts[1:]
    here = me + [name for start, end, name in sorted(inline) if start < at < end]
    if parts[0] == "self":
        return here + parts[1:]
    ups = 0
    while ups < len(parts) and parts[ups] == "super":
        ups += 1
    if ups > len(here):
        return None
    return here[: len(here) - ups] + parts[ups:]


def referenced(me: list[str], text: str) -> list[list[str]]:
    text = strip_comments(text)
    inline = inline_modules(text)
    paths = expand_use_groups(text)
    paths += [(m.start(), m.group(0)) for m in re.finditer(PREFIX + r"(?:::[A-Za-z_][A-Za-z0-9_]*)+", text)]
    out = []
    for at, path in paths:
        target = resolve(me, at, path, inline)
        if target:
            out.append(target)
    return out


def sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    global ROOT
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    failed = 0
    for root in [*sorted(REPO.glob("crates/*/src")), REPO / "src"]:
        ROOT = root
        print(f"{os.path.relpath(root, REPO)}: ", end="")
        failed |= check()
    return failed


def self_test() -> int:
    """The check on small trees: a loop of `super::` paths between sibling files is found, one
    made in a file's test module too (its `super::` is the file); a test module's
    `use super::*` and a one-way `self::`/`super::` are no loop."""
    import tempfile

    global ROOT
    trees = {
        "loop": ({"lib.rs": "mod a;\nmod b;\n", "a.rs": "use super::b::B;\n",
                  "b.rs": "pub struct B;\nfn f() { super::a::g() }\n"}, 1),
        "grouped": ({"lib.rs": "mod x;\n", "x/mod.rs": "mod a;\nmod b;\n",
                     "x/a.rs": "use super::{b::{self, B}};\n",
                     "x/b.rs": "use crate::x::a;\n"}, 1),
        "inline": ({"lib.rs": "mod a;\nmod b;\n", "a.rs": "use super::b::B;\n",
                    "b.rs": "pub struct B;\nmod tests {\n    use super::super::a::g;\n}\n"}, 1),
        "none": ({"lib.rs": "mod a;\nmod b;\n", "a.rs": "use super::b::B;\n",
                  "b.rs": "pub struct B;\n#[cfg(test)]\nmod tests {\n    use super::*;\n    use self::inner::X;\n    mod inner { pub struct X; }\n}\n"}, 0),
    }
    failed = 0
    for name, (files, want) in trees.items():
        with tempfile.TemporaryDirectory() as d:
            for rel, text in files.items():
                (Path(d) / rel).parent.mkdir(parents=True, exist_ok=True)
                (Path(d) / rel).write_text(text)
            ROOT = Path(d)
            got = check()
        if got != want:
            print(f"self-test {name}: the check gave {got}, not {want}")
            failed += 1
    print("self-test", "failed" if failed else "passed")
    return 1 if failed else 0


def check() -> int:
    modules = {
        tuple(module_of(p)) for p in ROOT.rglob("*.rs") if not (p.parent == ROOT and p.name in SKIP)
    }
    graphs: dict[tuple, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    why: dict[tuple, str] = {}
    for path in sorted(ROOT.rglob("*.rs")):
        if path.parent == ROOT and path.name in SKIP | {"lib.rs"}:
            continue
        me = module_of(path)
        for target in referenced(me, path.read_text()):
            # The longest prefix of the path that is a module.
            while target and tuple(target) not in modules:
                target = target[:-1]
            if not target:
                continue
            # The deepest level at which the two modules are siblings.
            depth = 0
            while depth < min(len(me), len(target)) and me[depth] == target[depth]:
                depth += 1
            if depth >= len(me) or depth >= len(target):
                continue  # a module and its own ancestor or descendant
            parent, a, b = tuple(me[:depth]), me[depth], target[depth]
            graphs[parent][a].add(b)
            why.setdefault((parent, a, b), f"{os.path.relpath(path, REPO)} names crate::{'::'.join(target)}")
    found = 0
    top = graphs[()]
    leaves = {
        m[0] for m in modules if len(m) == 1 and not (ROOT / m[0]).is_dir() and not top.get(m[0])
    }
    for a, targets in sorted(top.items()):
        for b in sorted(targets):
            if a in ONLY and b not in ONLY[a] and b not in leaves:
                rule = f"{a} names only leaves and {', '.join(sorted(ONLY[a]))}"
            elif b in NEVER.get(a, ()):
                rule = f"{a} never names {b}"
            else:
                continue
            found += 1
            print(f"layering broken: {a} -> {b}: {why[((), a, b)]} ({rule})")
    for parent, graph in sorted(graphs.items()):
        for comp in sccs(graph):
            found += 1
            where = "crate" if not parent else "crate::" + "::".join(parent)
            print(f"cycle among {where}::{{{', '.join(comp)}}}:")
            for a in comp:
                for b in sorted(graph[a]):
                    if b in comp:
                        print(f"  {a} -> {b}: {why[(parent, a, b)]}")
    if found:
        print(f"{found} module cycle(s) or broken layering rule(s)")
        return 1
    print(f"no module cycles, layering kept ({len(modules)} modules)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
