#!/usr/bin/env python3
"""Fails on what the house keeps small: a source file of a crate (`src/`, `crates/*/src/`; but
the simulator's, `crates/sim/`) of more than 600 lines, and a function under the proxy's
`crates/proxy/src/pipeline/` (its folders included) of more than 60
lines or more than 5 parameters.

A function's lines run from the line of its `fn` to the line of its closing brace (its doc
comment and attributes not counted); a declaration without a body is not one. Its parameters
are those of its signature, however many lines it takes, read past generics (`<K: Into<T>, V>`,
`F: Fn(A, B) -> C`); a `self` in any form (`&self`, `&mut self`, `self: Arc<Self>`, …) is not
counted. Closures are not functions. Comments, strings and character literals are read as
blanks, so a brace or an `fn` in them counts for nothing; a nested `fn` is a function of its own.

Each offence is printed as `path:line: …`; exit code 1 when there is one, 0 otherwise.
`--self-test` runs the check on small trees made for it (one offending tree per rule, one
that passes).
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILE_LINES = 600
FN_LINES = 60
FN_PARAMS = 5


RAW = re.compile(r'b?r(#*)"')
CHAR = re.compile(r"'(?:[^'\\\n]|\\u\{[0-9a-fA-F]+\}|\\x[0-9a-fA-F]{2}|\\.)'")


def blank_out(text: str) -> str:
    """`text` with comments, strings and character literals replaced by spaces (line breaks
    kept, so line numbers and offsets still hold)."""
    out = []
    i, n = 0, len(text)

    def blank(s: str) -> str:
        return "".join(c if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif (m := RAW.match(text, i)) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find('"' + m.group(1), m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
            out.append(blank(text[i:j]))
            i = j
        elif c == '"' or (c == "b" and text.startswith('b"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_"))):
            j = i + (2 if c == "b" else 1)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(blank(text[i : j + 1]))
            i = j + 1
        elif c == "'" and (m := CHAR.match(text, i)):
            out.append(blank(m.group(0)))
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def closing(code: str, i: int, pairs: dict[str, str]) -> int:
    """The offset just past the bracket that closes the one at `i` (`(`, `[`, `{` or `<`),
    the others of `pairs` nested inside; a `->` is an arrow, not a closing `>`."""
    stack = [pairs[code[i]]]
    j = i + 1
    while j < len(code) and stack:
        c = code[j]
        if c == ">" and code[j - 1] == "-":
            pass
        elif c in pairs:
            stack.append(pairs[c])
        elif c == stack[-1]:
            stack.pop()
        j += 1
    return j


ALL = {"(": ")", "[": "]", "{": "}", "<": ">"}
SELF = re.compile(r"^(?:&\s*(?:'\w+\s+)?)?(?:mut\s+)?self\b")


def params(list_text: str) -> list[str]:
    """The parameters of a signature's parameter list (without its parentheses)."""
    out, depth, start = [], 0, 0
    for j, c in enumerate(list_text):
        if c == ">" and j and list_text[j - 1] == "-":
            continue
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(list_text[start:j])
            start = j + 1
    out.append(list_text[start:])
    return [p.strip() for p in out if p.strip()]


def functions(text: str):
    """Each function with a body in `text`: (name, first line, lines, parameters but self)."""
    code = blank_out(text)
    for m in re.finditer(r"\bfn\s+([A-Za-z_]\w*)\s*", code):
        name, i = m.group(1), m.end()
        if i < len(code) and code[i] == "<":
            i = closing(code, i, ALL)
        while i < len(code) and code[i].isspace():
            i += 1
        if i >= len(code) or code[i] != "(":
            continue
        end = closing(code, i, ALL)
        taken = [p for p in params(code[i + 1 : end - 1]) if not SELF.match(p)]
        # The body: the first `{` or `;` past the return type and where clause, not inside
        # brackets of theirs (`impl Fn(A) -> B`, `where T: Into<U>`).
        j, depth = end, 0
        while j < len(code):
            c = code[j]
            if c == ">" and code[j - 1] == "-":
                pass
            elif c in "(<[":
                depth += 1
            elif c in ")>]":
                depth -= 1
            elif depth <= 0 and c in "{;":
                break
            j += 1
        if j >= len(code) or code[j] == ";":
            continue
        body_end = closing(code, j, {"{": "}"})
        first = code.count("\n", 0, m.start()) + 1
        last = code.count("\n", 0, body_end - 1) + 1
        yield name, first, last - first + 1, len(taken)


def rust_files(root: Path):
    return sorted([*(root / "src").rglob("*.rs"), *root.glob("crates/*/src/**/*.rs")])


def crate_and_module(rel: Path) -> tuple[str, tuple[str, ...]]:
    """The crate a source file is in (`switchboard` for the root's `src/`) and its path inside
    that crate's `src/`."""
    parts = rel.parts
    if parts[0] == "crates":
        return parts[1], parts[3:]
    return "switchboard", parts[1:]


def check(root: Path) -> int:
    offences = []
    for path in rust_files(root):
        rel = path.relative_to(root)
        crate, inner = crate_and_module(rel)
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        if crate != "sim" and lines > FILE_LINES:
            offences.append(f"{rel}:{FILE_LINES + 1}: {lines} lines, more than {FILE_LINES}")
        if crate == "proxy" and inner[0] == "pipeline":
            for name, line, length, count in functions(text):
                if length > FN_LINES:
                    offences.append(f"{rel}:{line}: fn {name} has {length} lines, more than {FN_LINES}")
                if count > FN_PARAMS:
                    offences.append(f"{rel}:{line}: fn {name} takes {count} parameters, more than {FN_PARAMS}")
    for o in offences:
        print(o)
    if offences:
        print(f"{len(offences)} offence(s) against the house's sizes")
        return 1
    print("house sizes kept")
    return 0


def self_test() -> int:
    """The check on small trees: a long file outside the simulator's crate, a long pipeline
    function and one with six parameters are each found; a long file in `crates/sim/`, and
    pipeline functions
    that only look long or many-parameterized (self, generics with commas, closures, braces and
    `fn` in strings and comments, a multi-line signature) pass."""
    import tempfile

    long_body = "    let x = 1;\n" * 59
    sixty_body = "        let x = 1;\n" * (FN_LINES - 2)
    trees = {
        "long file": ({"src/a.rs": "// x\n" * (FILE_LINES + 1)}, 1),
        "long fn": ({"crates/proxy/src/pipeline/step.rs": f"fn step() {{\n{long_body}    x;\n}}\n"}, 1),
        "six params": (
            {
                "crates/proxy/src/pipeline/deep/step.rs": (
                    "pub fn step<K: Into<String>, V>(\n    a: K,\n    b: V,\n    c: u8,\n"
                    "    d: impl Fn(u8, u8) -> u8,\n    e: HashMap<u8, u8>,\n    f: (u8, u8),\n) -> u8 {\n    0\n}\n"
                )
            },
            1,
        ),
        "passing": (
            {
                "crates/sim/src/big.rs": "// x\n" * (FILE_LINES + 1),
                "src/ok.rs": "// x\n" * FILE_LINES,
                "crates/proxy/src/pipeline/step.rs": (
                    "impl S {\n"
                    "    pub async fn go<'a, T: Fn(u8, u8) -> u8>(\n        &'a mut self,\n"
                    "        a: HashMap<u8, Vec<(u8, u8)>>,\n        b: &'a str,\n        c: T,\n"
                    "        d: [u8; 2],\n        e: u8,\n    ) -> Result<(), E>\n    where\n        T: Clone,\n    {\n"
                    "        let f = |a: u8, b: u8, c: u8, d: u8, e: u8, f: u8| a + b + c + d + e + f;\n"
                    "        let s = \"fn fake(a: u8, b: u8, c: u8, d: u8, e: u8, f: u8) { {\";\n"
                    "        let c = '{';\n"
                    "        // fn commented(a: u8, b: u8, c: u8, d: u8, e: u8, f: u8) {\n"
                    "        Ok(())\n    }\n"
                    "    fn by_arc(self: Arc<Self>, a: u8, b: u8, c: u8, d: u8, e: u8) {}\n"
                    "    fn declared(&self, a: u8, b: u8, c: u8, d: u8, e: u8, f: u8);\n"
                    f"    fn sixty() {{\n{sixty_body}    }}\n"
                    "}\n"
                ),
            },
            0,
        ),
    }
    failed = 0
    for name, (files, want) in trees.items():
        with tempfile.TemporaryDirectory() as d:
            for rel, text in files.items():
                (Path(d) / rel).parent.mkdir(parents=True, exist_ok=True)
                (Path(d) / rel).write_text(text)
            got = check(Path(d))
        if got != want:
            print(f"self-test {name}: the check gave {got}, not {want}")
            failed += 1
    print("self-test", "failed" if failed else "passed")
    return 1 if failed else 0


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    return check(ROOT)


if __name__ == "__main__":
    sys.exit(main())
