#!/usr/bin/env bash
# executors: a script's run never writes into the user's project (issue 30). As it was seen: the
# run's work directory linked the project's files, a script's torch.save("model.pt") overwrote
# the project's own model.pt through the link, and tandem.artifact("model.pt") then refused the
# link. The project here has model.pt, data/notes.txt and the script itself; the script (run by
# `tandem run -- python3 ...`, the Python SDK on PYTHONPATH) reads its input, writes model.pt and
# data/notes.txt where the project has them, and records model.pt with tandem.artifact. Asserts:
#   - the project's model.pt and data/notes.txt are byte for byte what they were (SHA-256);
#   - the run's artifact model.pt holds the script's bytes: its SHA-256 in `tandem artifacts`
#     and in a --download copy equals hashlib's of the bytes the script wrote;
#   - the script read the project's input (data/input.txt) from its work directory;
#   - an entry too large to copy for every run (bigdata/, 65 MiB) is linked, and the log says so.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
. "$SRC/tests/lib/project.sh"
project_init script-workdir
PY=${PYTHON:-/usr/bin/python3}
export PYTHONPATH=$SRC/python

mkdir -p data
head -c 4096 /dev/urandom >model.pt
echo "the project's notes" >data/notes.txt
echo "an input" >data/input.txt
mkdir bigdata # over TD_EXEC_WORK_COPY_MAX_BYTES (64 MiB): linked, not copied into every run
truncate -s 65M bigdata/train.bin
cat >write_model.py <<'PY'
import hashlib, os
import tandem
tandem.init()
assert open("data/input.txt").read() == "an input\n", "the project's input is not in the work dir"
data = b"the script's model " + os.urandom(8192)
with open("model.pt", "wb") as f:        # as torch.save("model.pt") opens it
    f.write(data)
with open("data/notes.txt", "w") as f:  # a file in a directory the project has
    f.write("the script's notes\n")
with open(os.path.join(os.environ["TANDEM_RUN_DIR"], "expected.sha256"), "w") as f:
    f.write(hashlib.sha256(data).hexdigest())
tandem.artifact("model.pt")
tandem.finish()
PY
sha() { "$PY" -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"; }
model0=$(sha model.pt)
notes0=$(sha data/notes.txt)

"$B" run --name wd -- "$PY" write_model.py >run.log 2>&1 || { cat run.log >&2; fail "tandem run failed"; }
R=$P/.tandem/runs/wd-1
[ "$(sha model.pt)" = "$model0" ] || fail "the project's model.pt was overwritten by the run"
[ "$(sha data/notes.txt)" = "$notes0" ] || fail "the project's data/notes.txt was overwritten: $(cat data/notes.txt)"
echo "ok: the project's model.pt and data/notes.txt are untouched"
want=$(cat "$R/expected.sha256") || fail "the script wrote no expected.sha256"
listed=$("$B" artifacts wd-1 | awk '$1 == "model.pt" {print $3}')
[ "$listed" = "$want" ] || fail "tandem artifacts lists model.pt with sha256 '$listed', the script wrote $want: $("$B" artifacts wd-1)"
"$B" artifacts wd-1 --download dl >/dev/null || fail "tandem artifacts --download"
[ "$(sha dl/model.pt)" = "$want" ] || fail "the downloaded model.pt is not the script's bytes"
echo "ok: the artifact model.pt holds the script's bytes (sha256 $want, hashlib)"
[ -d "$R/work/data" ] && [ ! -L "$R/work/data" ] || fail "the run's data/ is not a directory of its own"
[ -L "$R/work/bigdata" ] || fail "bigdata/ (65 MiB) was not linked into the run's work directory"
grep -rqE "linked into the run's work directory, not copied .*: ([^;]*, )?bigdata[,;]" run.log "$R/logs" ||
  fail "no line says bigdata/ was linked: $(cat run.log)"
echo "ok: bigdata/ (over 64 MiB) linked, and said so"
