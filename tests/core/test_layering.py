"""An #include that reaches up a layer, or into another layer's src/, does not compile.

Each layer compiles with the include directories CMake gives td_<layer> (read from
$TANDEM_BUILD_DIR/tandem-layers.txt, the same list its own sources are compiled with). In that
context this test compiles one tiny probe per header:
  - #include "tandem/<h>.h" for every public header: it must compile where the header's layer
    is the layer itself or in its closure (DEPS, HEADERS, transitively), which also shows each
    public header is self-contained, and must fail with "No such file" everywhere else;
  - #include "<m>/<x>.h" for every internal header of src/<m>/: it must be found from layer m
    and fail with "No such file" from every other layer.
The expected successes are the control: a context that sees nothing fails them, so the test
cannot pass vacuously. Then no file under src/ may #include a path with "..", the one way
around include directories. Last, the run store's shape (issue 31): no file of src/track over
800 lines and no circle of calls among its files; and src/ui names nothing that would open a
run's metrics files (RUN/metrics, rank-R.jsonl): it asks the store.
"""
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile

from layer_graph import GRAPH, read_graph  # tests/core/layer_graph.py

SOURCE = os.environ.get("TANDEM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


def closure(layers, name, seen=None):
    seen = set() if seen is None else seen
    if name not in seen:
        seen.add(name)
        for dep in layers[name]["deps"] + layers[name]["hdeps"]:
            closure(layers, dep, seen)
    return seen


def main():
    if not os.path.exists(GRAPH):
        print(f"FAIL: {GRAPH} missing: configure with CMake first")
        return 1
    tools, headers, layers = read_graph()
    cc = tools.get("cc") or "cc"
    implicit = set(tools.get("implicit", "").split())
    errors = []

    source_include = os.path.realpath(os.path.join(SOURCE, "include"))
    source_src = os.path.realpath(os.path.join(SOURCE, "src"))
    for name, L in layers.items():
        for d in L["incs"]:
            if os.path.realpath(d) in (source_include, source_src):
                errors.append(f"td_{name} compiles with -I{d}: it sees every layer's headers")

    internal = {}
    for name in layers:
        src_dir = os.path.join(SOURCE, "src", name)
        internal[name] = sorted(f for f in os.listdir(src_dir) if f.endswith(".h"))

    work = tempfile.mkdtemp(prefix="tandem-layering-")
    probes = []  # (layer, include, expect_found, full_compile)
    for name in layers:
        seen = closure(layers, name)
        for h, owner in sorted(headers.items()):
            probes.append((name, f"tandem/{h}", owner in seen, True))
        for m, files in internal.items():
            for f in files:
                # An internal header of its own need only be found: some are C++ or need the
                # including file's context (kernels.h of the CUDA backend).
                probes.append((name, f"{m}/{f}", m == name, False))

    def run(probe):
        name, include, expect_found, full = probe
        path = os.path.join(work, f"{name}-{include.replace('/', '-')}.c")
        with open(path, "w") as f:
            f.write(f'#include "{include}"\nint tandem_layering_probe;\n')
        args = [cc, "-std=gnu11", "-D_GNU_SOURCE", "-fsyntax-only", path]
        args += [f"-I{d}" for d in layers[name]["incs"] if d not in implicit]
        r = subprocess.run(args, capture_output=True, text=True)
        # gcc: "x.h: No such file or directory"; clang: "'x.h' file not found"
        inc = re.escape(include)
        missing = re.search(r"fatal error: (%s: No such file|'%s' file not found)" % (inc, inc),
                            r.stderr)
        if expect_found:
            if missing or (full and r.returncode != 0):
                return (f"src/{name} cannot compile #include \"{include}\" though its layer is "
                        f"in {name}'s closure:\n{r.stderr.strip()}")
        elif r.returncode == 0 or not missing:
            why = "compiles" if r.returncode == 0 else f"fails otherwise:\n{r.stderr.strip()}"
            whose = ("a layer above or beside it" if include.startswith("tandem/")
                     else "another layer's internal header")
            return (f"src/{name}: #include \"{include}\" ({whose}) should fail with 'No such "
                    f"file' but {why}")
        return None

    jobs = max(2, os.cpu_count() or 2)
    try:
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            results = list(pool.map(run, probes))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    errors += [r for r in results if r]
    found = sum(1 for p in probes if p[2])

    include_re = re.compile(r'^\s*#\s*include\s*[<"]([^>"]*)[>"]', re.M)
    for root, dirs, files in os.walk(os.path.join(SOURCE, "src")):
        # npm's packages (the dashboard's uPlot, under src/ui/web) are not tandem's C code.
        dirs[:] = [d for d in dirs if d != "node_modules"]
        for f in files:
            if not f.endswith((".c", ".h", ".cu")):
                continue
            path = os.path.join(root, f)
            with open(path, errors="replace") as fh:
                for inc in include_re.findall(fh.read()):
                    if ".." in inc.split("/"):
                        errors.append(f"{os.path.relpath(path, SOURCE)}: #include \"{inc}\" "
                                      f"climbs out of its directory: include \"<layer>/x.h\" "
                                      f"of its own layer or a public header")

    errors += track_shape_errors()
    errors += ui_metrics_errors()

    for e in errors:
        print("FAIL:", e)
    if errors:
        return 1
    print(f"ok: {len(probes)} probes over {len(layers)} layers: {found} headers of a layer and "
          f"its closure found, {len(probes) - found} others refused")
    for name in layers:
        seen = closure(layers, name) - {name}
        print(f"  {name:9s} sees {' '.join(sorted(seen)) or '-'}")
    return 0


# The run store's files (issue 31): each under this many lines, and their calls to one another's
# functions without a cycle, so the store reads bottom up (record, database, rows, updates,
# liveness, ingest, rebuild) instead of as one circle in which every file needs every other.
TRACK_MAX_LINES = 800
C_NOISE = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\])\'', re.S)
C_DEF = re.compile(r'^(?!static\b)[A-Za-z_][\w \t\*]*?\b(td_\w+)\s*\([^;{]*\)\s*\{', re.M)
C_CALL = re.compile(r'\b(td_\w+)\s*\(')


def file_cycles(graph):
    """The strongly connected components of more than one file (Tarjan's algorithm)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def track_shape_errors(track_dir=None):
    track_dir = track_dir or os.path.join(SOURCE, "src", "track")
    errors, defs, calls = [], {}, {}
    for f in sorted(os.listdir(track_dir)):
        if not f.endswith((".c", ".h")):
            continue
        with open(os.path.join(track_dir, f), errors="replace") as fh:
            text = fh.read()
        nlines = text.count("\n")
        if nlines > TRACK_MAX_LINES:
            errors.append(f"src/track/{f} has {nlines} lines, over {TRACK_MAX_LINES}: split it "
                          f"along what it does (docs/runs.md \"The store's files\")")
        if f.endswith(".c"):
            code = C_NOISE.sub(" ", text)
            for name in C_DEF.findall(code):
                defs[name] = f
            calls[f] = set(C_CALL.findall(code))
    graph = {f: {defs[c] for c in cs if c in defs and defs[c] != f} for f, cs in calls.items()}
    for comp in file_cycles(graph):
        edges = [f"{a} -> {b}" for a in comp for b in sorted(graph[a]) if b in comp]
        errors.append(f"src/track: the files {', '.join(comp)} call one another in a circle "
                      f"({'; '.join(edges)}): move the shared part below them, or pass a hook")
    if not defs:
        errors.append("src/track: no function definitions found; the call-graph check is void")
    return errors


# What in src/ui would open a run's metrics files (issue 31: the UI asks the store, whose ingest
# is the one reader of RUN/metrics; one run's huge or blocked file must not stall other pages).
UI_METRICS_NAMES = re.compile(r'TD_RUN_PATH_METRICS|td_metrics_file_\w+|td_ingester_\w+|'
                              r'"[^"\n]*(?:metrics/|\.jsonl)[^"\n]*"')


def ui_metrics_errors(ui_dir=None):
    ui_dir = ui_dir or os.path.join(SOURCE, "src", "ui")
    errors = []
    for f in sorted(os.listdir(ui_dir)):
        if not f.endswith((".c", ".h")):
            continue
        with open(os.path.join(ui_dir, f), errors="replace") as fh:
            text = re.sub(r'/\*.*?\*/|//[^\n]*', " ", fh.read(), flags=re.S)
        for m in UI_METRICS_NAMES.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            errors.append(f"src/ui/{f}:{line}: {m.group(0)} reaches into a run's metrics files; "
                          f"ask the store (td_run_events, td_metrics_*) instead")
    return errors


if __name__ == "__main__":
    sys.exit(main())
