"""The layer graph CMake built ($TANDEM_BUILD_DIR/tandem-layers.txt), read once for the two
layering tests (test_layering.py, test_link_graph.py). Lines are `|`-separated:
  cc|<compiler>, nm|<nm>, implicit|<dirs>          tools
  header|<header>|<owning layer>
  layer|<name>|<archive>|<deps>|<header deps>|<library files>|<library flags>|<include dirs>
"""
import os

BUILD = os.environ.get("TANDEM_BUILD_DIR", "build")
GRAPH = os.path.join(BUILD, "tandem-layers.txt")


def read_graph():
    """(tools, headers, layers): tools by name, each public header's layer, and per layer a dict
    of archive, deps, hdeps, lib_files, lib_flags and incs (lists but the archive)."""
    tools, headers, layers = {}, {}, {}
    with open(GRAPH) as f:
        for line in f:
            parts = line.rstrip("\n").split("|")
            if parts[0] == "layer":
                _, name, archive, deps, hdeps, lib_files, lib_flags, incs = parts
                layers[name] = {"archive": archive, "deps": deps.split(), "hdeps": hdeps.split(),
                                "lib_files": lib_files.split(), "lib_flags": lib_flags.split(),
                                "incs": incs.split()}
            elif parts[0] == "header":
                headers[parts[1]] = parts[2]
            else:
                tools[parts[0]] = parts[1]
    return tools, headers, layers
