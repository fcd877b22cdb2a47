# Sourced by tests/executors/test_script_record_*.sh after `tandem run rec` of
# tests/executors/script_record.py: script_record_check NODE0_HOST asserts that the run rec-1
# succeeded with the script's config, summary and tag in `tandem show`, its RUN/sdk.json, and
# both artifacts with the SHA-256 the script printed (hashlib, on the node) in `tandem artifacts`
# and in a --download copy. Needs B, P, PY and fail.
script_record_check() {
    local R sums want_model want_weights arts got show
    R=$P/.tandem/runs/rec-1
    show=$("$B" show rec-1) || fail "tandem show rec-1"
    grep -q '^status  *succeeded' <<<"$show" || fail "rec-1 did not succeed: $show"
    grep -qE '^  lr  *0.25$' <<<"$show" || fail "no config lr 0.25 in tandem show: $show"
    grep -qE '^  layers  *3$' <<<"$show" || fail "no config layers 3 in tandem show: $show"
    grep -qE '^  best_acc  *0.9375$' <<<"$show" || fail "no summary best_acc 0.9375 (the last value): $show"
    grep -qE '^tags .*from-node' <<<"$show" || fail "no tag from-node: $(grep -i tag <<<"$show")"
    "$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["run_id"] == "rec-1" and d["summary"]["best_acc"] == 0.9375, d
' "$R/sdk.json" || fail "RUN/sdk.json is not the script's"
    echo "ok: config, summary and tags of the script on $1 are in the run's record"

    sums=$(grep -ho 'sha256 [a-z.]* [0-9a-f]*' "$R/logs/rank-0.log")
    [ "$(wc -l <<<"$sums")" = 2 ] || fail "the script's sha256 lines: $sums"
    want_model=$(awk '$2 == "model.bin" {print $3}' <<<"$sums")
    want_weights=$(awk '$2 == "weights.bin" {print $3}' <<<"$sums")
    arts=$("$B" artifacts rec-1)
    [ "$(awk '$1 == "model.bin" {print $3}' <<<"$arts")" = "$want_model" ] ||
    fail "model.bin: tandem artifacts says '$arts', the script wrote $want_model"
    [ "$(awk '$1 == "sub/weights.bin" {print $3}' <<<"$arts")" = "$want_weights" ] ||
    fail "sub/weights.bin: tandem artifacts says '$arts', the script wrote $want_weights"
    [ "$(grep -c '\.bin ' <<<"$arts")" = 2 ] || fail "expected 2 artifacts: $arts"
    "$B" artifacts rec-1 --download "$P/dl" >/dev/null || fail "tandem artifacts --download"
    got=$("$PY" -c 'import hashlib,sys; print(*(hashlib.sha256(open(p,"rb").read()).hexdigest() for p in sys.argv[1:]))' \
    "$P/dl/model.bin" "$P/dl/sub/weights.bin")
    [ "$got" = "$want_model $want_weights" ] || fail "downloaded copies: $got, want $want_model $want_weights"
    echo "ok: both artifacts of rank 0 on $1 are in the store, SHA-256 equal to hashlib's on the host"
}
