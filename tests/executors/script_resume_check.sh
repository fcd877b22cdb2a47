# Sourced by tests/executors/test_script_resume_*.sh and test_fw_resume_*.sh. After a run of
# tests/lib/sdk_resume_train.py (2 ranks, --steps STEPS) that lost a node or a worker
# and restarted once: script_resume_check RUN STEPS asserts that RUN succeeded with restarts 1;
# both ranks' logs say they resumed from one step, >= 10; train/loss is stored once at each step
# 1..STEPS; the script's config (steps), summary (final_loss) and tag are in `tandem show`; its
# artifact w.pt (tandem.artifact) is in the store and torch.equal to the out/w.pt of an
# uninterrupted run of 2 local workers. Needs B, P, SRC, FW_PY and fail.
script_resume_check() {
    local run=$1 steps_n=$2 R show r0 r1 steps
    R=$P/.tandem/runs/$run
    show=$("$B" show "$run")
    grep -q '^status  *succeeded' <<<"$show" || fail "$run did not succeed: $show"
    grep -q '^restarts  *1$' <<<"$show" || fail "restarts: $(grep restarts <<<"$show")"
    r0=$(sed -n 's/^.*rank 0 resumed from step \([0-9]*\).*/\1/p' "$R/logs/rank-0.log" | tail -1)
    r1=$(sed -n 's/^.*rank 1 resumed from step \([0-9]*\).*/\1/p' "$R/logs/rank-1.log" | tail -1)
    [ -n "$r0" ] && [ "$r0" -ge 10 ] || fail "rank 0 did not resume from a checkpoint ('$r0')"
    [ "$r0" = "$r1" ] || fail "rank 0 resumed from step $r0, rank 1 from step '$r1'"
    echo "both ranks resumed from step $r0"
    steps=$("$B" metrics "$run" --key train/loss --csv | tail -n +2 | cut -d, -f3 | sort -n | tr '\n' ' ')
    [ "$steps" = "$(seq 1 $steps_n | tr '\n' ' ')" ] || fail "train/loss steps are not 1..$steps_n once each: $steps"
    grep -qE '^  steps  *'$steps_n'$' <<<"$show" || fail "no config steps $steps_n in tandem show: $show"
    grep -qE '^  final_loss  *[0-9.e-]+$' <<<"$show" || fail "no summary final_loss in tandem show: $show"
    grep -qE '^tags .*resumed-script' <<<"$show" || fail "no tag resumed-script: $(grep -i tag <<<"$show")"
    "$B" artifacts "$run" | grep -q '^w.pt ' || fail "no artifact w.pt: $("$B" artifacts "$run")"
    "$B" artifacts "$run" --download "$P/dl-$run" >/dev/null || fail "tandem artifacts --download"
    mkdir -p "$P/ref"
    (cd "$P/ref" && env -u TANDEM_HOME PYTHONPATH="$SRC/python" timeout -k 5 200 "$B" launch --standalone \
        --nproc-per-node 2 -- "$FW_PY" "$SRC/tests/lib/sdk_resume_train.py" --steps $steps_n --sleep 0) \
        >"$P/ref.log" 2>&1 || fail "the uninterrupted run of 2 local workers: exit $?"
    "$FW_PY" - "$P/dl-$run/w.pt" "$P/ref/out/w.pt" <<'PY' || fail "the weights differ from the uninterrupted run's"
import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
assert a.keys() == b.keys(), (a.keys(), b.keys())
bad = [k for k in a if not torch.equal(a[k], b[k])]
assert not bad, f"differ: {bad}"
PY
    echo "succeeded, restarts 1; train/loss 1..$steps_n once each; config, summary, tag and w.pt in the" \
         "store; the weights torch.equal to the uninterrupted run's"
}

# fw_resume_check RUN FRAMEWORK STEPS HOLD KEY FIRST, after a run of tests/cloud/spot_fw_train.py
# FRAMEWORK (lightning|hf) on 2 nodes x 1 worker whose first attempt held after step HOLD's
# checkpoint and lost a node there: RUN succeeded with restarts 1; both ranks resumed from step
# HOLD, the TANDEM_RESUME_STEP their agents handed them; KEY is stored once at each of STEPS
# steps from FIRST (Lightning's logger numbers them from 0, the HF Trainer's from 1); config and summary are in `tandem show`; the out/w.pt artifact is torch.equal to
# an uninterrupted run of 2 local workers (the script's inputs depend on the step and rank only,
# and 2 ranks' gradients average order-free: bitwise equal). Needs B, P, SRC, FW_PY and fail.
fw_resume_check() {
    local run=$1 fw=$2 steps_n=$3 hold=$4 key=$5 first=$6 R show r steps want
    R=$P/.tandem/runs/$run
    show=$("$B" show "$run")
    grep -q '^status  *succeeded' <<<"$show" || fail "$run did not succeed: $show"
    grep -q '^restarts  *1$' <<<"$show" || fail "restarts: $(grep restarts <<<"$show")"
    for r in 0 1; do
        grep -q "rank $r resumed from step $hold (TANDEM_RESUME_STEP=$hold)" "$R/logs/rank-$r.log" ||
            fail "$run: rank $r did not resume from step $hold: $(grep -h 'resumed from' "$R/logs/rank-$r.log")"
    done
    echo "$run: both ranks resumed from step $hold"
    steps=$("$B" metrics "$run" --key "$key" --csv | tail -n +2 | cut -d, -f3 | sort -n | tr '\n' ' ')
    want=$(seq $first $((first + steps_n - 1)) | tr '\n' ' ')
    [ "$steps" = "$want" ] || fail "$run: $key steps are not $want once each: $steps"
    [ -n "$(show_section "$run" config)" ] || fail "$run: no config in tandem show: $show"
    [ -n "$(show_section "$run" summary)" ] || fail "$run: no summary in tandem show: $show"
    "$B" artifacts "$run" | grep -q 'out/w.pt' || fail "$run: no artifact out/w.pt: $("$B" artifacts "$run")"
    "$B" artifacts "$run" --download "$P/dl-$run" >/dev/null || fail "tandem artifacts --download"
    mkdir -p "$P/ref-$fw"
    if [ ! -f "$P/ref-$fw/out/w.pt" ]; then
        # FW_PY holds the wheel (fw_python; the fw legs need it): its SDK, no PYTHONPATH
        (cd "$P/ref-$fw" && env -u TANDEM_HOME -u PYTHONPATH TANDEM_CHECKPOINT_DIR="$P/ref-$fw/checkpoints" \
            timeout -k 5 300 "$B" launch --standalone --nproc-per-node 2 -- "$FW_PY" \
            "$SRC/tests/cloud/spot_fw_train.py" "$fw" --steps $steps_n --sleep 0) \
            >"$P/ref-$fw.log" 2>&1 || fail "$run: the uninterrupted run of 2 local workers: exit $?"
    fi
    "$FW_PY" - "$P/dl-$run/out/w.pt" "$P/ref-$fw/out/w.pt" <<'PY' || fail "$run: the weights differ from the uninterrupted run's"
import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
assert a.keys() == b.keys(), (a.keys(), b.keys())
bad = [k for k in a if not torch.equal(a[k], b[k])]
assert not bad, f"differ: {bad}"
PY
    echo "$run: succeeded, restarts 1; $key at $steps_n steps once each; config, summary and out/w.pt in" \
         "the store; the weights torch.equal to the uninterrupted run's"
}
show_section() { "$B" show "$1" 2>/dev/null | awk -v t="$2:" '$0 == t {on = 1; next} on && /^$/ {exit} on'; }
