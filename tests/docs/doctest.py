#!/usr/bin/env python3
"""Runs the shell blocks of the documentation and checks the output they show, and checks links.

Called by tests/docs/run.sh, which starts the daemon first. The convention (also in
docs/README.md):

- A fenced block whose info string is exactly `sh` is a command a reader pastes: it runs, in a
  fresh `bash` with `set -euo pipefail`, from the repository's root, with `ratemeshd` on PATH and
  a node on the embedded default configuration listening on its default ports. It must exit 0.
- A `text` block right after it (nothing but blank lines between) is the output it shows: the
  block's stdout must match it line by line. A line `...` matches any number of lines (none
  included); `...` inside a line matches any run of characters; trailing white space and `\r`
  are ignored, as are blank lines at the end. A `text` block anywhere else is not checked.
- `sh no-run` (any info string with the word `no-run`) is shown, never run: long-running
  commands (`serve`, `cargo run`), builds, docker, kubectl, clusters of several nodes, commands
  that need a configuration other than the embedded default. Every other language (`toml`,
  `rust`, `yaml`, `nginx`, `text`, ...) is never run.

Blocks run in file order, files in the order given; they share the one node, so a block should
use keys of its own. Files under docs/history/ are records: their links are checked, their
blocks are not run.

Links: every relative link `[text](path)` and `[text](path#anchor)` of every file given must
name an existing file, and an anchor a heading of the target (GitHub's slugs).

Usage: doctest.py [--links-only] FILE...   Exit 1 on the first failing block (with FILE:LINE)
or any broken link.
"""
import os
import re
import subprocess
import sys
import time

FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*(.*)$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
BLOCK_TIMEOUT_S = 60


def blocks(path):
    """(line of the opening fence, info string, body lines) for every fenced block."""
    out = []
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m:
            fence, info, start = m.group(2), m.group(3).strip(), i + 1
            body = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(fence):
                body.append(lines[i])
                i += 1
            out.append((start, info, body, i + 1))
        i += 1
    return out, lines


def runnable(info):
    return info == "sh"


def expected_after(all_blocks, idx, lines):
    """The `text` block right after block idx, if only blank lines separate them."""
    if idx + 1 >= len(all_blocks):
        return None, None
    _, _, _, end = all_blocks[idx]
    nxt_line, info, body, _ = all_blocks[idx + 1]
    between = lines[end:nxt_line - 1]
    if info == "text" and all(not l.strip() for l in between):
        return body, nxt_line
    return None, None


def line_matches(pattern, line):
    if "..." not in pattern:
        return pattern == line
    parts = [re.escape(p) for p in pattern.split("...")]
    return re.fullmatch(".*".join(parts), line, re.DOTALL) is not None


def output_matches(expected, actual):
    def clean(ls):
        ls = [l.rstrip().rstrip("\r").rstrip() for l in ls]
        while ls and not ls[-1]:
            ls.pop()
        return ls

    exp, act = clean(expected), clean(actual)

    def go(i, j):
        while i < len(exp):
            if exp[i] == "...":
                return any(go(i + 1, k) for k in range(j, len(act) + 1))
            if j >= len(act) or not line_matches(exp[i], act[j]):
                return False
            i, j = i + 1, j + 1
        return j == len(act)

    return go(0, 0)


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    found = set()
    counts = {}
    in_fence = False
    for line in open(path, encoding="utf-8"):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence and line.startswith("#"):
            s = slug(line.lstrip("#").strip().replace("`", ""))
            n = counts.get(s, 0)
            counts[s] = n + 1
            found.add(s if n == 0 else f"{s}-{n}")
    return found


def check_links(path):
    errors = []
    in_fence = False
    for no, line in enumerate(open(path, encoding="utf-8"), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not os.path.exists(dest):
                errors.append(f"{path}:{no}: broken link {target}: no {dest}")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                errors.append(f"{path}:{no}: broken link {target}: no heading #{anchor} in {dest}")
    return errors


def run_file(path, env):
    all_blocks, lines = blocks(path)
    ran = 0
    for idx, (line, info, body, _) in enumerate(all_blocks):
        if not runnable(info):
            continue
        script = "set -euo pipefail\n" + "\n".join(body) + "\n"
        started = time.monotonic()
        try:
            proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                                  timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"{path}:{line}: FAILED: the block ran for more than {BLOCK_TIMEOUT_S} s")
            return False, ran
        took = time.monotonic() - started
        ran += 1
        if proc.returncode != 0:
            print(f"{path}:{line}: FAILED: exit status {proc.returncode}")
            print("--- block\n" + "\n".join(body))
            print("--- stdout\n" + proc.stdout + "--- stderr\n" + proc.stderr, end="")
            return False, ran
        expected, exp_line = expected_after(all_blocks, idx, lines)
        if expected is not None and not output_matches(expected, proc.stdout.split("\n")):
            print(f"{path}:{line}: FAILED: the output does not match the one shown at {path}:{exp_line}")
            print("--- block\n" + "\n".join(body))
            print("--- expected\n" + "\n".join(expected))
            print("--- stdout\n" + proc.stdout + "--- stderr\n" + proc.stderr, end="")
            return False, ran
        checked = " (output checked)" if expected is not None else ""
        print(f"ok  {path}:{line}  {took:.2f} s{checked}")
    return True, ran


def main(argv):
    links_only = "--links-only" in argv
    files = [a for a in argv if a != "--links-only"]
    errors = []
    for f in files:
        errors += check_links(f)
    for e in errors:
        print(e)
    if errors:
        print(f"doctest: {len(errors)} broken link(s)")
        return 1
    print(f"doctest: links of {len(files)} files ok")
    if links_only:
        return 0
    env = dict(os.environ)
    total = 0
    for f in files:
        if f.startswith("docs/history/"):
            continue
        ok, ran = run_file(f, env)
        total += ran
        if not ok:
            return 1
    print(f"doctest: {total} blocks ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
