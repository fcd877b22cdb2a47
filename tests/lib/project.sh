# A scratch tandem project for workflow tests: source it, then call
#   project_setup TAG    checks that Fashion-MNIST is there (else exits 77, naming it), makes the
#                        project directory $P (/tmp/tandem-TAG-XXXXXX) with TANDEM_HOME=$P, cds
#                        into it, clears the variables `tandem run` sets for its workers, and sets
#                        an EXIT trap that kills whatever of the project still runs (a failed
#                        assertion mid-run) and removes $P.
#   project_init TAG     the same without the data set, for runs that do not train.
# Both set B to $TANDEM_BIN (which must be set) and define fail MESSAGE (prints FAIL, exits 1).
# A test with more to clean up sets its own EXIT trap after them and calls project_cleanup.
# Shared checks: expect_contains / expect_lacks HAYSTACK NEEDLE WHAT; show_field RUN KEY (the
# value of one line of `tandem show RUN`); show_section RUN TITLE (the lines of its section
# "TITLE:", e.g. config or summary).
# It reads TANDEM_DATA (default Debian's dataset-fashion-mnist) into $DATA.
project_setup() {
    DATA=${TANDEM_DATA:-/usr/share/datasets/fashion-mnist}
    if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
        echo "SKIP: Fashion-MNIST not found in $DATA (Debian package dataset-fashion-mnist)"
        exit 77
    fi
    project_init "$1"
}

fail() { echo "FAIL: $*" >&2; exit 1; }

project_init() {
    B=${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}
    P=$(mktemp -d "/tmp/tandem-$1-XXXXXX")
    trap project_cleanup EXIT
    export TANDEM_HOME=$P
    unset TANDEM_PROGRESS TANDEM_RESUME TANDEM_CHECKPOINT_DIR TANDEM_METRICS
    cd "$P" || exit 1
}

project_cleanup() {
    local f
    for f in $(grep -lz "^TANDEM_RUN_DIR=$P/" /proc/[0-9]*/environ 2>/dev/null); do
        f=${f%/environ}
        kill -9 "${f#/proc/}" 2>/dev/null
    done
    rm -rf "$P"
}

expect_contains() { # haystack needle what
    case "$1" in *"$2"*) ;; *) fail "$3: expected to contain '$2', got: $1" ;; esac
}
expect_lacks() { # haystack needle what
    case "$1" in *"$2"*) fail "$3: expected no '$2', got: $1" ;; esac
}
show_field() { # run key
    "$B" show "$1" 2>/dev/null | sed -n "s/^$2  *//p" | head -1
}
show_section() { # run title
    "$B" show "$1" 2>/dev/null | awk -v t="$2:" '$0 == t {on = 1; next} on && /^$/ {exit} on'
}
