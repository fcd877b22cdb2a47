"""The CMake link graph tells the truth (CMakeLists.txt, tandem_layer).

For each layer's archive, nm lists the symbols it uses but does not define. Then:
  - every layer named in DEPS defines at least one of them (no edge the code does not use);
  - every layer that defines one of them is named in DEPS (no edge counted on through another
    layer, none left to link order), and no used td_* symbol is defined nowhere;
  - a HEADERS layer (types only) defines none of them, and the layer does include its header;
  - every external library file under LIBS defines at least one of them, and a symbol that one
    of the project's external library files defines is used only by a layer that names that
    library (libraries that are flags or linker names, Threads/OpenMP/m/rt/dl, nm cannot check).
The graph comes from $TANDEM_BUILD_DIR/tandem-layers.txt, which CMake writes from the same
tandem_layer() calls that link the archives. Prints the graph it checked.
"""
import os
import re
import subprocess
import sys

from layer_graph import GRAPH, read_graph  # tests/core/layer_graph.py

SOURCE = os.environ.get("TANDEM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
UNDEFINED = {"U", "w", "v"}  # nm -P: undefined, weak undefined


def nm_symbols(nm, path, dynamic=False):
    """(defined, undefined) external symbol names of an archive or a shared library."""
    args = [nm, "-P", "-g"] + (["-D"] if dynamic else []) + [path]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 2 or line.endswith(":"):
            continue  # an archive member's header
        name, kind = fields[0].split("@")[0], fields[1]  # drop symbol versions (name@@VER)
        (undefined if kind in UNDEFINED else defined).add(name)
    return defined, undefined


def sample(symbols, n=3):
    s = sorted(symbols)
    return ", ".join(s[:n]) + (", ..." if len(s) > n else "")


def main():
    if not os.path.exists(GRAPH):
        print(f"FAIL: {GRAPH} missing: configure with CMake first")
        return 1
    tools, headers, layers = read_graph()
    nm = tools.get("nm") or "nm"
    defs, uses = {}, {}
    for name, L in layers.items():
        if not os.path.exists(L["archive"]):
            print(f"FAIL: {L['archive']} missing: build first")
            return 1
        defined, undefined = nm_symbols(nm, L["archive"])
        defs[name], uses[name] = defined, undefined - defined
    lib_defs = {}
    for L in layers.values():
        for lib in L["lib_files"]:
            if lib not in lib_defs:
                lib_defs[lib] = nm_symbols(nm, os.path.realpath(lib), dynamic=True)[0]

    errors = []
    print("layer -> layers whose code it calls (symbols used) | external libraries")
    for name, L in layers.items():
        used = uses[name]
        calls = {m: used & defs[m] for m in layers if m != name and used & defs[m]}
        for dep in L["deps"]:
            if dep not in calls:
                errors.append(f"{name} names {dep} in DEPS but calls none of its code: "
                              f"remove the edge (tandem_layer({name} ...) in CMakeLists.txt)")
        for m, syms in sorted(calls.items()):
            if m in L["hdeps"]:
                errors.append(f"{name} calls {m}'s code ({sample(syms)}) but names it under "
                              f"HEADERS (types only): move it to DEPS")
            elif m not in L["deps"]:
                errors.append(f"{name} calls {m}'s code ({sample(syms)}) without naming {m} in "
                              f"DEPS: add the edge (tandem_layer({name} ...) in CMakeLists.txt)")
        all_defs = set().union(*defs.values())
        nowhere = {s for s in used if s.startswith("td_") and s not in all_defs}
        if nowhere:
            errors.append(f"{name} uses {sample(nowhere)}, which no layer defines")
        for h in L["hdeps"]:
            owned = [hd for hd, owner in headers.items() if owner == h]
            alternatives = "|".join(map(re.escape, owned))
            pattern = re.compile(r'#\s*include\s*[<"]tandem/(%s)[>"]' % alternatives)
            texts = []
            src_dir = os.path.join(SOURCE, "src", name)
            for f in sorted(os.listdir(src_dir)):
                texts.append(open(os.path.join(src_dir, f), errors="replace").read())
            for hd, owner in headers.items():
                if owner == name:
                    texts.append(open(os.path.join(SOURCE, "include", "tandem", hd)).read())
            if not any(pattern.search(t) for t in texts):
                errors.append(f"{name} names {h} under HEADERS but includes none of its headers "
                              f"({', '.join(owned)}): remove the edge")
        # External libraries.
        lib_calls = {}
        for lib in L["lib_files"]:
            syms = used & lib_defs[lib]
            if syms:
                lib_calls[lib] = syms
            else:
                errors.append(f"{name} links {lib} (LIBS) but calls nothing of it: remove it")
        project_defs = set().union(*defs.values())
        missing = {}
        for lib, ldefs in lib_defs.items():
            if lib in L["lib_files"]:
                continue
            syms = {s for s in used & ldefs if s not in project_defs and
                    not any(s in lib_defs[own] for own in L["lib_files"])}
            if syms:
                missing[lib] = syms
        for lib, syms in sorted(missing.items()):
            errors.append(f"{name} calls {sample(syms)} of {lib} without naming it in LIBS")
        ext = [os.path.basename(lib) for lib in L["lib_files"]] + \
              [f"{flag} (unchecked)" for flag in L["lib_flags"]]
        graph = " ".join(f"{m}({len(s)})" for m, s in sorted(calls.items()))
        hd = f" [types: {' '.join(L['hdeps'])}]" if L["hdeps"] else ""
        print(f"  {name:9s} -> {graph or '-'}{hd} | {', '.join(ext) or '-'}")

    for e in errors:
        print("FAIL:", e)
    if errors:
        return 1
    print(f"ok: {len(layers)} layers, every edge used and every use an edge")
    return 0


if __name__ == "__main__":
    sys.exit(main())
