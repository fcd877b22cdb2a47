#!/usr/bin/env bash
# track: issue 8, "A run store on a full disk: a run that succeeded is recorded as failed ('its
# supervisor is gone'), and its rank log was cut at 1.9 MB without a word." The project's
# .tandem is a small tmpfs; a run's command fills it and succeeds. Then:
#   - the run is recorded as succeeded (the store frees .tandem/reserve to write the status),
#     its note and run.json say the disk was full and name it, never "supervisor is gone";
#   - what was written before is intact: the earlier run, the run's first metrics, run.json;
#   - the user is told what happened and where to free space, once, not twice a second;
#   - once space is freed the reserve comes back and `tandem reindex` stores the metric lines the
#     full disk kept out of the index;
#   - creating a run on a full disk fails with an error naming the disk, leaving nothing behind;
#   - the metrics sink of `tandem train` says once that points are being dropped.
# Needs root (mount); skipped with the reason otherwise.
set -uo pipefail
B=${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "mounting a tmpfs needs root"
P=$(mktemp -d /tmp/tandem-fulldisk-XXXXXX)
T=$P/.tandem
mkdir -p "$T"
if ! mount -t tmpfs -o size=24m tmpfs "$T" 2>"$P/mount.err"; then
  msg=$(cat "$P/mount.err")
  rm -rf "$P"
  skip "cannot mount a tmpfs (not permitted here?): $msg"
fi
cleanup() {
  cd /
  umount "$T" 2>/dev/null || umount -l "$T" 2>/dev/null
  rm -rf "$P"
}
trap cleanup EXIT
export TANDEM_HOME=$P
cd "$P"
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_contains() { # haystack needle what
  case "$1" in *"$2"*) ;; *) fail "$3: expected to contain '$2', got: $1" ;; esac
}
field() { "$B" show "$1" 2>/dev/null | sed -n "s/^$2  *//p" | head -1; }
steps() { "$B" metrics "$1" --csv --key loss | tail -n +2 | cut -d, -f3 | tr '\n' ' '; }

cat > "$T/workflows.yaml" <<'EOF'
workflows:
  - name: ok
    command: |
      echo '{"step": 1, "loss": 0.5}' >> "$TANDEM_METRICS"
  - name: fill
    command: |
      for i in 1 2 3; do echo "{\"step\": $i, \"loss\": 0.$i}" >> "$TANDEM_METRICS"; done
      sleep 1.5
      dd if=/dev/zero of="$TANDEM_RUN_DIR/checkpoints/fill" bs=64k 2>/dev/null
      for i in 4 5 6; do echo "{\"step\": $i, \"loss\": 0.$i}" >> "$TANDEM_METRICS" || true; done
      sleep 1.5
      echo finished
EOF

out=$("$B" run ok 2>&1) || fail "tandem run ok: $out"
expect_contains "$out" "run ok-1 succeeded" "the earlier run"
[ "$(stat -c %s "$T/reserve" 2>/dev/null)" = 4194304 ] || fail "no 4 MiB reserve in $T: $(ls -l "$T")"

# --- a run that fills the disk and succeeds
out=$("$B" run fill 2>&1)
code=$?
[ "$code" = 0 ] || fail "tandem run fill exited $code: $out"
expect_contains "$out" "finished" "the command ran to its end"
[ "$(df -k --output=avail "$T" | tail -1 | tr -d ' ')" -lt 8192 ] || fail "the disk did not fill: $(df -k "$T")"
[ "$(field fill-1 status)" = succeeded ] || fail "fill-1 recorded as $(field fill-1 status): $("$B" show fill-1)"
note=$(field fill-1 note)
expect_contains "$note" "the disk was full" "fill-1 note"
expect_contains "$note" "free space on $T" "fill-1 note names the disk"
case "$note" in *supervisor*) fail "fill-1 note blames the supervisor: $note" ;; esac
"${PYTHON:-python3}" - "$T/runs/fill-1/run.json" "$T" <<'EOF' || fail "run.json of fill-1: $(cat "$T/runs/fill-1/run.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["id"] == "fill-1" and r["status"] == "succeeded" and r["exit_code"] == 0, r
assert "the disk was full" in r["note"] and sys.argv[2] in r["note"], r
EOF
[ ! -e "$T/reserve" ] || fail "the reserve was not used (still there)"
# what the user read: the disk, by name, and the fix
expect_contains "$out" "the filesystem mounted at $T is full" "tandem run output names the disk"
expect_contains "$out" "free space on $T" "tandem run output gives the fix"
[ "$(grep -c 'are not being stored' <<<"$out")" = 1 ] \
  || fail "the ingester's warning should appear once: $out"
# earlier rows intact
[ "$(field ok-1 status)" = succeeded ] || fail "ok-1 after the full disk: $("$B" show ok-1)"
[ "$(steps ok-1)" = "1 " ] || fail "ok-1 metrics: $(steps ok-1)"
case "$(steps fill-1)" in "1 2 3 "*) ;; *) fail "fill-1's first metrics: $(steps fill-1)" ;; esac
[ "$(wc -l < "$T/runs/fill-1/metrics/rank-0.jsonl")" = 6 ] || fail "metrics file: $(cat "$T/runs/fill-1/metrics/rank-0.jsonl")"

# SUPERVISOR (src/workflow/run.c) from here to the end of this block: these two hold once the
# supervisor (1) does not repeat the ingester's TD_ERR_NOSPACE at every poll ("metrics ingest:
# ... (will retry)" twice a second: the ingester says it once, the reserve warning once), and
# (2) ends with the note as stored, which the store completed with the full disk.
nsaid=$(grep -c "is full (" <<<"$out")
[ "$nsaid" -le 3 ] || fail "the full disk was reported $nsaid times (at most 3 expected): $out"
last=$(grep "run fill-1 succeeded" <<<"$out" | tail -1)
expect_contains "$last" "the disk was full" "the supervisor's last line"
# end of SUPERVISOR

# --- space freed: the reserve comes back, reindex stores what the full disk kept out
rm -f "$T/runs/fill-1/checkpoints/fill"
"$B" ps >/dev/null 2>&1 || fail "tandem ps after freeing space"
[ "$(stat -c %s "$T/reserve" 2>/dev/null)" = 4194304 ] || fail "the reserve did not come back"
out=$("$B" reindex 2>&1) || fail "tandem reindex: $out"
[ "$(steps fill-1)" = "1 2 3 4 5 6 " ] || fail "fill-1 metrics after reindex: $(steps fill-1) ($out)"
[ "$(field fill-1 status)" = succeeded ] || fail "reindex changed fill-1"

# --- creating a run on a full disk: a clear error, nothing left behind
dd if=/dev/zero of="$T/filler" bs=64k 2>/dev/null
before=$(ls "$T/runs")
if out=$("$B" run ok 2>&1); then fail "a run was created on a full disk: $out"; fi
expect_contains "$out" "free space on $T" "error on a full disk names the disk"
[ "$(ls "$T/runs")" = "$before" ] || fail "a run directory was left behind: $(ls "$T/runs")"
rm -f "$T/filler"
[ "$(field fill-1 status)" = succeeded ] && [ "$(field ok-1 status)" = succeeded ] \
  || fail "runs changed after the failed creation"

# --- the metrics sink says once that points are dropped
DATA=${TANDEM_DATA:-/usr/share/datasets/fashion-mnist}
if [ -e "$DATA/train-images-idx3-ubyte.gz" ] || [ -e "$DATA/train-images-idx3-ubyte" ]; then
  : > "$T/train.jsonl"
  dd if=/dev/zero of="$T/filler" bs=64k 2>/dev/null
  out=$(TANDEM_METRICS=$T/train.jsonl "$B" train --model mlp7 --data "$DATA" --steps 3 --batch 16 2>&1) \
    || fail "tandem train with a full metrics disk failed: $out"
  [ "$(grep -c 'metrics points are being dropped' <<<"$out")" = 1 ] \
    || fail "the sink should say once that points are dropped: $out"
  expect_contains "$out" "free space on $T" "the sink names the disk"
  rm -f "$T/filler"
fi
echo "test_full_disk: ok"
