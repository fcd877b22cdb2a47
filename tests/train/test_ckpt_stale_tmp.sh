#!/usr/bin/env bash
# A checkpoint write killed mid-way (SIGKILL) left its temporary file, .ckpt-<step>.tdck.tmp.<pid>
# (24-45 MB for the presets), in the checkpoint directory forever. Now a trainer that opens the
# directory (the resume's search, every save) removes such files whose writer is gone, and only
# those:
#   a. two valid checkpoints, then the leftovers of dead writers (the pid in the name is no
#      process), a temporary file of a live pid, one of a dead pid whose lock is still held (a
#      writer on another host of a shared file system) and another program's temporary file;
#   b. `--resume`: the dead writers' files are gone, the other three are there, the valid
#      checkpoints are byte for byte the same and the resume used the newest;
#   c. a fresh run (no --resume) in a directory holding only a leftover: gone after its first save.
set -euo pipefail
: "${TANDEM_BIN:?}" "${TANDEM_DATA:?}"
if [ ! -f "$TANDEM_DATA/train-images-idx3-ubyte.gz" ]; then
  echo "SKIP: Fashion-MNIST not found in $TANDEM_DATA"
  exit 77
fi
work=$(mktemp -d /tmp/tandem-stale-tmp-XXXXXX)
holders=()
cleanup() {
  local p
  for p in "${holders[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  ls -la "$work/ck" "$work/ck2" >&2 2>/dev/null || true
  [ -f "$work/out" ] && tail -n 20 "$work/out" >&2
  exit 1
}
train=(train --model mlp7 --data "$TANDEM_DATA" --batch 16 --threads 1 --no-progress)

dead_pid() { # a pid that was a process a moment ago and is none now
  local p
  sleep 0 & p=$!
  wait "$p"
  kill -0 "$p" 2>/dev/null && fail "pid $p still lives"
  echo "$p"
}
leftover() { # path: a half-written temporary file (1 MB of a checkpoint's header and zeros)
  { printf 'TDCKPT\r\n'; head -c 1048568 /dev/zero; } >"$1"
}

# --- a. valid checkpoints, then leftovers
ck=$work/ck
"$TANDEM_BIN" "${train[@]}" --steps 20 --checkpoint-every 10 --checkpoint-dir "$ck" \
  >"$work/out" 2>&1 || fail "first run exited $?"
[ -f "$ck/ckpt-10.tdck" ] && [ -f "$ck/ckpt-20.tdck" ] || fail "no ckpt-10 and ckpt-20"
sums=$(cd "$ck" && sha256sum ckpt-10.tdck ckpt-20.tdck)
d1=$(dead_pid)
d2=$(dead_pid)
stale1=$ck/.ckpt-30.tdck.tmp.$d1
stale2=$ck/.ckpt-20.tdck.tmp.$d2 # the temporary of a rewrite of an existing checkpoint
leftover "$stale1"
leftover "$stale2"
sleep 300 >/dev/null 2>&1 &
live=$!
holders+=("$live")
live_tmp=$ck/.ckpt-40.tdck.tmp.$live # a live writer: kept
leftover "$live_tmp"
locked_tmp=$ck/.ckpt-50.tdck.tmp.$(dead_pid) # dead here, but its writer's lock is held: kept
leftover "$locked_tmp"
(exec 9<>"$locked_tmp" && flock -x 9 && exec sleep 300) >/dev/null 2>&1 &
holders+=("$!")
for _ in $(seq 100); do flock -n -x "$locked_tmp" true 2>/dev/null || break; sleep 0.05; done
flock -n -x "$locked_tmp" true 2>/dev/null && fail "could not hold the lock on $locked_tmp"
other=$ck/.weights.safetensors.tmp.$d1 # another file's temporary: not the trainer's to remove
leftover "$other"

# --- b. the resume removes the dead writers' files, nothing else
"$TANDEM_BIN" "${train[@]}" --steps 20 --checkpoint-every 10 --checkpoint-dir "$ck" --resume \
  >"$work/out" 2>&1 || fail "resume exited $?"
grep -q "resuming from $ck/ckpt-20.tdck" "$work/out" || fail "the resume did not use ckpt-20.tdck"
[ -e "$stale1" ] && fail "$stale1 (writer pid $d1 is gone) is still there"
[ -e "$stale2" ] && fail "$stale2 (writer pid $d2 is gone) is still there"
grep -q "removed $stale1" "$work/out" || fail "the removal of $stale1 was not reported"
[ -e "$live_tmp" ] || fail "$live_tmp was removed though pid $live lives"
[ -e "$locked_tmp" ] || fail "$locked_tmp was removed though its writer's lock is held"
[ -e "$other" ] || fail "$other (not a checkpoint's temporary) was removed"
[ "$(cd "$ck" && sha256sum ckpt-10.tdck ckpt-20.tdck)" = "$sums" ] ||
  fail "the valid checkpoints changed: $(cd "$ck" && sha256sum ckpt-*.tdck)"
echo "ok: resume removed $(basename "$stale1") and $(basename "$stale2"); kept the live," \
  "locked and foreign temporaries and ckpt-10/ckpt-20 unchanged"

# --- c. a fresh run removes a leftover at its first save
ck2=$work/ck2
mkdir "$ck2"
stale3=$ck2/.ckpt-10.tdck.tmp.$(dead_pid)
leftover "$stale3"
"$TANDEM_BIN" "${train[@]}" --steps 10 --checkpoint-every 10 --checkpoint-dir "$ck2" \
  >"$work/out" 2>&1 || fail "fresh run exited $?"
[ -e "$stale3" ] && fail "$stale3 is still there after a fresh run saved"
[ "$(ls -A "$ck2")" = ckpt-10.tdck ] || fail "$ck2 holds: $(ls -A "$ck2" | tr '\n' ' ')"
echo "ok: a fresh run removed $(basename "$stale3") at its first save"
echo "test_ckpt_stale_tmp: ok"
