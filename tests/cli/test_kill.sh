#!/usr/bin/env bash
# cli: `tandem kill RUN --rank R` signals that run's worker of rank R and no other process, found
# through the run's own records (its supervisor, then the descendant whose environment says run
# and rank). A decoy carries the same run id, rank and command line outside the run: the old
# README recipe, `pgrep -n -f`, picks the newest such process, which is the decoy; tandem kill
# must not. The run has max_restarts 1: the launcher sees rank 1 die by SIGKILL and restarts both
# workers, whose second attempt exits 0, so the run succeeds with 1 restart. The pid it names is
# checked against the pid the worker itself wrote down (not tandem's own word).
set -uo pipefail
. "${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib/project.sh"
project_init kill

# First attempt: each worker writes its pid and RANK, then waits to be killed. Second attempt
# (after the restart): exit 0.
cat >worker.sh <<'EOF'
if [ "${TANDEM_RESTART_COUNT:-0}" != 0 ]; then echo "rank $RANK restarted"; exit 0; fi
echo $$ >"$PROJECT_DIR/pid-$RANK.tmp" && mv "$PROJECT_DIR/pid-$RANK.tmp" "$PROJECT_DIR/pid-$RANK"
while :; do sleep 1; done
EOF
export PROJECT_DIR=$P
"$B" run --name k --nproc-per-node 2 --max-restarts 1 -- sh "$P/worker.sh" >run.log 2>&1 &
runner=$!

for ((i = 0; i < 6000; i++)); do
    [ -f pid-0 ] && [ -f pid-1 ] && break
    kill -0 "$runner" 2>/dev/null || fail "the run ended before its workers started: $(tail -20 run.log)"
    sleep 0.05
done
[ -f pid-1 ] || fail "no worker wrote its pid in 300 s: $(tail -20 run.log)"
worker1=$(cat pid-1)
# The decoy: the same command line and the run's variables, started after the workers (newest);
# it writes its pid elsewhere.
mkdir decoy
PROJECT_DIR=$P/decoy TANDEM_RUN_ID=k-1 RANK=1 sh "$P/worker.sh" &
decoy=$!
disown "$decoy" # its end at cleanup is ours, not a job to report
trap 'kill -9 $decoy 2>/dev/null; project_cleanup' EXIT
for ((i = 0; i < 6000; i++)); do [ -f decoy/pid-1 ] && break; sleep 0.05; done
newest=$(pgrep -u "$(id -u)" -n -f "^sh $P/worker.sh")
[ "$newest" = "$decoy" ] || fail "the decoy ($decoy) is not what pgrep -n finds ($newest)"

# Bad requests first, while the run lives: no --rank, a rank the run does not have.
err=$("$B" kill k-1 2>&1)
[ $? = 2 ] && grep -q -- "--rank R is required" <<<"$err" || fail "kill without --rank: $err"
err=$("$B" kill k-1 --rank 2 2>&1)
[ $? = 2 ] && grep -q "ranks 0 .. 1; --rank 2 is none" <<<"$err" || fail "kill --rank 2: $err"
err=$("$B" kill k-1 --rank 1 --signal NOPE 2>&1)
[ $? = 2 ] && grep -q -- "--signal 'NOPE'" <<<"$err" || fail "kill --signal NOPE: $err"

# Rank 1's worker and those of its ancestors that are rank 1's too (a shell in front of it): the
# launcher above them, the supervisor above that, are not.
rank1_chain="" p=$worker1
while [ -n "$p" ] && [ "$p" -gt 1 ] && grep -qz '^RANK=1$' "/proc/$p/environ" 2>/dev/null; do
    rank1_chain="$rank1_chain $p"
    p=$(ps -o ppid= -p "$p" | tr -d ' ')
done
out=$("$B" kill k-1 --rank 1 2>&1) || fail "tandem kill k-1 --rank 1: exit $?: $out"
# The pid it names is rank 1's worker: the process that wrote pid-1, or the shell in front of it
# (the launcher's child), whose process group holds it.
named=$(grep -o "sent SIGKILL to rank 1 of run k-1 (pid [0-9]*" <<<"$out" | grep -o '[0-9]*$')
[ -n "$named" ] || fail "tandem kill k-1 --rank 1 said: $out"
expect_contains " $rank1_chain " " $named " "rank 1's worker processes (the one that wrote pid-1 and its ancestors with RANK=1)"
for ((i = 0; i < 6000; i++)); do kill -0 "$worker1" 2>/dev/null || break; sleep 0.05; done
kill -0 "$worker1" 2>/dev/null && fail "rank 1's worker $worker1 still lives after tandem kill"
wait "$runner"
rc=$?
[ "$rc" = 0 ] || fail "the run exited $rc after the kill, expected 0 (restarted): $(tail -20 run.log)"
kill -0 "$decoy" 2>/dev/null || fail "the decoy $decoy (same run id, rank and command line, not the run's) was killed"
grep -q '^restarts  *1$' <<<"$("$B" show k-1)" || fail "k-1: not restarted once: $("$B" show k-1)"
grep -q "rank 1 restarted" run.log || fail "rank 1 did not run its second attempt: $(tail -20 run.log)"

# An ended run has no worker to signal.
err=$("$B" kill k-1 --rank 0 2>&1)
[ $? = 1 ] && grep -q "run k-1 has ended (succeeded)" <<<"$err" || fail "kill of an ended run: $err"
echo "test_kill: rank 1 (pid $worker1) of k-1 killed, the decoy $decoy that pgrep -n picks untouched; the run restarted and succeeded"
