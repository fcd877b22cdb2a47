#!/usr/bin/env bash
# workflow: each run has its own working directory (issue 8). As it was seen: two concurrent runs
# of one workflow with different params shared its output paths, and the first run recorded the
# second run's weights as its artifact (SHA-256 verified, and wrong). Now the commands of a run
# run in <run_dir>/work, where the project's entries are linked (inputs resolve as before) but
# declared outputs start empty; artifacts are collected there. Asserts:
#   - two overlapping runs write out/w.txt each, and each run's artifact holds its own param;
#   - the project's out/ is untouched, inputs (a script in the project) are found;
#   - TANDEM_WORK_DIR / TANDEM_PROJECT_DIR say where the run is and where it came from.
set -uo pipefail
B=${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}
P=$(mktemp -d /tmp/tandem-workdir-XXXXXX)
trap 'rm -rf "$P"' EXIT
export TANDEM_HOME=$P
cd "$P"
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p .tandem out bin
echo "the project's own file" > out/w.txt
cat > bin/write.sh <<'EOF'
#!/bin/sh
# an input that lives in the project: found through the run directory's link
mkdir -p out
echo "tag=$1 work=$TANDEM_WORK_DIR project=$TANDEM_PROJECT_DIR" > out/w.txt
# both runs are alive together: each waits for the other's start before finishing
touch "$TANDEM_PROJECT_DIR/started-$1"
for _ in $(seq 100); do [ -e "$TANDEM_PROJECT_DIR/started-a" ] && [ -e "$TANDEM_PROJECT_DIR/started-b" ] && break; sleep 0.1; done
cat out/w.txt
EOF
chmod +x bin/write.sh
cat > .tandem/workflows.yaml <<'EOF'
workflows:
  - name: writer
    params:
      tag: none
    command: sh bin/write.sh "$TANDEM_PARAM_TAG"
    artifacts: [out/w.txt]
EOF

"$B" run writer --param tag=a > a.out 2>&1 &
pa=$!
"$B" run writer --param tag=b > b.out 2>&1 &
pb=$!
wait $pa || fail "run a failed: $(cat a.out)"
wait $pb || fail "run b failed: $(cat b.out)"
[ -e started-a ] && [ -e started-b ] || fail "the runs did not both start"

ids=$("$B" ps -a | awk 'NR > 1 {print $1}')
[ "$(echo "$ids" | wc -l)" -eq 2 ] || fail "expected 2 runs, got: $ids"
for id in $ids; do
  tag=$("$B" show "$id" | sed -n 's/.*"tag": *"\([ab]\)".*/\1/p' | head -1)
  [ -n "$tag" ] || tag=$("$B" show "$id" | grep -o 'tag=[ab]' | head -1 | cut -d= -f2)
  [ -n "$tag" ] || fail "run $id: no tag param in tandem show: $("$B" show "$id")"
  rm -rf "dl-$id"
  "$B" artifacts "$id" --download "dl-$id" > /dev/null || fail "tandem artifacts $id --download"
  art=$(cat "dl-$id/out/w.txt" 2> /dev/null || cat "dl-$id/w.txt")
  case "$art" in
    "tag=$tag work=$P/.tandem/runs/$id/work project=$P") echo "ok: run $id ($tag) kept its own output" ;;
    *) fail "run $id with tag=$tag recorded the artifact: $art" ;;
  esac
done
[ "$(cat out/w.txt)" = "the project's own file" ] || fail "the project's out/w.txt was overwritten"
echo "ok: the project's out/ is untouched"
