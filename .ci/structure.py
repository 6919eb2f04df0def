#!/usr/bin/env python3
"""Checks the shape of the Rust crates (issue 27): no import circle between
the top-level modules of a crate, nor among the files of one folder, and no
source file over 900 lines.

A module A imports B when a file of A names `crate::B` (top level), or, among
the files of one folder, `super::B` or `crate::<folder>::B` (a sibling file);
`mod.rs` is the folder's own door and is left out of its folder's graph.
Comments and `#[cfg(test)] mod` blocks are ignored (unit tests may use any
module of their crate); grouped paths (`crate::{a, b::C}`) count every member.

ENFORCED says which kinds of problem fail each crate; the others are
reported (ficco-cuda's long files, until its restructure is done: issue
27). Usage: python3 .ci/structure.py [--all] (`--all` enforces
everything).
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CRATES = {
    "ficco-core": "crates/ficco-core/src",
    "ficco-cuda": "crates/ficco-cuda/src",
    "ficco-testkit": "crates/ficco-testkit/src",
    "ficco (CLI)": "src",
    "ficco (Python)": "python/src",
}
ALL = {"lines", "top", "folder"}
# What each crate must pass; the rest is reported (every check is enforced
# everywhere since issue 27's restructure).
ENFORCED = {
    "ficco-core": ALL,
    "ficco-testkit": ALL,
    "ficco (CLI)": ALL,
    "ficco (Python)": ALL,
    "ficco-cuda": ALL,
}
MAX_LINES = 900

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def strip_tests(text):
    """Drops `#[cfg(test)] mod x { ... }` blocks: unit tests may use any
    module of their crate without making a layer point back."""
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*mod\s+" + IDENT + r"\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 0, m.end() - 1
        while j < len(text):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        i = j + 1
    out.append(text[i:])
    return "".join(out)


def group_members(text, start):
    """The first path segments of a `{...}` group opening at text[start]."""
    depth, i, item, out = 0, start, "", []
    while i < len(text):
        c = text[i]
        if c == "{":
            depth += 1
            if depth == 1:
                i += 1
                continue
        elif c == "}":
            depth -= 1
            if depth == 0:
                out.append(item)
                break
        if depth == 1 and c == ",":
            out.append(item)
            item = ""
        elif depth >= 1:
            item += c
        i += 1
    firsts = []
    for it in out:
        m = re.match(r"\s*(" + IDENT + r")", it)
        if m and m.group(1) not in ("self",):
            firsts.append(m.group(1))
    return firsts


def referenced(text, prefix):
    """First segments after every `prefix::` in text (groups expanded)."""
    found = set()
    for m in re.finditer(r"\b" + re.escape(prefix) + r"::", text):
        rest = text[m.end():]
        if rest.startswith("{"):
            found.update(group_members(text, m.end()))
        else:
            n = re.match(IDENT, rest)
            if n:
                found.add(n.group(0))
    return found


def files_of(src):
    for dirpath, _, names in os.walk(src):
        for n in names:
            if n.endswith(".rs"):
                yield os.path.join(dirpath, n)


def module_path(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return rel


def cycles(nodes, edges):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
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
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def check_crate(name, src, root=ROOT):
    problems = []
    files = sorted(files_of(os.path.join(root, src)))
    texts, texts_raw = {}, {}
    for f in files:
        with open(f, encoding="utf-8") as fh:
            raw = fh.read()
        texts_raw[f] = strip_comments(raw)
        texts[f] = strip_tests(texts_raw[f])
        n = raw.count("\n")
        if n > MAX_LINES:
            problems.append(("lines", f"{os.path.relpath(f, root)}: {n} lines (at most {MAX_LINES})"))
    src_abs = os.path.join(root, src)
    # Files declared `#[cfg(test)] mod x;` are tests too: left out.
    test_files = set()
    for f in files:
        base = os.path.dirname(f) if os.path.basename(f) in ("mod.rs", "lib.rs", "main.rs") \
            else f[:-3]
        for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+(" + IDENT + r")\s*;", texts_raw[f]):
            for cand in (os.path.join(base, m.group(1) + ".rs"), os.path.join(base, m.group(1), "mod.rs")):
                test_files.add(os.path.normpath(cand))
    files = [f for f in files if os.path.normpath(f) not in test_files]
    top = {module_path(src_abs, f)[0] for f in files if module_path(src_abs, f)}
    # Top level: module A -> B for every crate::B named in A's files.
    edges = {}
    for f in files:
        mp = module_path(src_abs, f)
        if not mp:
            continue
        for b in referenced(texts[f], "crate") & top:
            if b != mp[0]:
                edges.setdefault(mp[0], set()).add(b)
    for c in cycles(top, edges):
        problems.append(("top", "top-level import circle: " + " <-> ".join(c)))
    # Each folder: its files (not mod.rs) and the siblings they name.
    folders = {}
    for f in files:
        mp = module_path(src_abs, f)
        base = os.path.basename(f)
        if not mp or base in ("mod.rs", "lib.rs", "main.rs"):
            continue
        folders.setdefault(tuple(mp[:-1]), {})[mp[-1]] = f
    for folder, members in folders.items():
        names = set(members)
        fedges = {}
        for m, f in members.items():
            refs = referenced(texts[f], "super")
            if folder:
                refs |= referenced(texts[f], "crate::" + "::".join(folder))
            else:
                refs = set()  # top level: handled above
            for b in refs & names:
                if b != m:
                    fedges.setdefault(m, set()).add(b)
        where = "/".join(folder) or "(top)"
        for c in cycles(names, fedges):
            problems.append(("folder", f"import circle among the files of {where}/: " + " <-> ".join(c)))
    return problems


def self_test():
    """The check finds a planted top-level circle, a circle among a
    folder's files and a long file, and ignores circles through tests (an
    inline test module, and a file declared `#[cfg(test)] mod t;`)."""
    import tempfile

    files = {
        "lib.rs": "pub mod a;\npub mod b;\npub mod f;\n",
        "a.rs": "use crate::b::X;\n",
        "b.rs": "pub struct X;\nfn g() { crate::a::h(); }\n",
        "f/mod.rs": "mod p;\nmod q;\nmod r;\n#[cfg(test)]\nmod t;\n",
        "f/t.rs": "use super::p;\n",
        "f/p.rs": "use super::{q::Q, r, t};\n",
        "f/q.rs": "pub struct Q;\nuse super::p;\n",
        "f/r.rs": "#[cfg(test)]\nmod tests {\n    use super::super::p;\n}\n"
        + "// use super::p;\n" + "\n" * (MAX_LINES + 1),
    }
    with tempfile.TemporaryDirectory() as d:
        for name, text in files.items():
            path = os.path.join(d, "src", name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as fh:
                fh.write(text)
        got = [text for _, text in check_crate("planted", "src", root=d)]
    want = [
        "src/f/r.rs: 906 lines (at most 900)",
        "top-level import circle: a <-> b",
        "import circle among the files of f/: p <-> q",
    ]
    if got != want:
        sys.exit(f"structure self-test: expected {want}, got {got}")


def main():
    self_test()
    enforce_all = "--all" in sys.argv
    failed = False
    for name, src in CRATES.items():
        problems = check_crate(name, src)
        enforced = ALL if enforce_all else ENFORCED.get(name, set())
        if not problems:
            print(f"structure: {name}: ok")
            continue
        bad = [text for kind, text in problems if kind in enforced]
        known = [text for kind, text in problems if kind not in enforced]
        print(f"structure: {name}: {len(bad)} failing, {len(known)} known (issue 27)")
        for text in bad:
            print(f"  FAIL {text}")
        for text in known:
            print(f"  known {text}")
        failed |= bool(bad)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
