#!/usr/bin/env bash
# torch: Hugging Face's Trainer and Accelerate on backend="tandem" (torch_hf.py: a tiny GPT-2
# built in the test, 8 AdamW steps on fixed random tokens, 2 ranks):
#   - TrainingArguments(use_cpu=True, ddp_backend="tandem") and
#     Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(backend="tandem")]), under
#     `tandem launch` and under torchrun: Accelerate (1.x) would refuse the name on CPU; importing
#     tandem.torch makes it take it (python/tandem/torch/_accelerate.py);
#   - the group is tandem's and the model really is wrapped in DDP (a run that silently trained
#     each rank alone would pass a loss comparison with a gloo run that did the same): both
#     ranks end with bitwise-equal weights, and they see different data;
#   - every step's loss on each rank equals gloo's run within 1e-5 relative (at 2 ranks both
#     backends add a + b, so the same bits are expected; seen: 0), and the final weights too;
#     under torchrun the weights are bitwise those of `tandem launch`;
#   - the way that needs no patch: dist.init_process_group("tandem") first, then
#     Accelerator(cpu=True) without a backend, trains on the tandem group, as gloo's run.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
. "$SRC/tests/torch/lib.sh"
torch_setup
"$FW_PY" -c 'import transformers, accelerate' 2>/dev/null ||
    { echo "SKIP: no transformers/accelerate in the frameworks venv"; exit 77; }
W=$(mktemp -d /tmp/tandem-torch-hf-XXXXXX)
trap 'rm -rf "$W"' EXIT
HF=$SRC/tests/torch/torch_hf.py

job() { # name, launcher (launch|torchrun), mode, backend
    local name=$1 how=$2
    if [ "$how" = launch ]; then
        launch_job 2 "$FW_PY" "$HF" "$3" "$4" "$W/$name" >"$W/$name.log" 2>&1
    else
        torchrun_job 2 "$HF" "$3" "$4" "$W/$name" >"$W/$name.log" 2>&1
    fi || { tail -30 "$W/$name.log" >&2; fail "$name ($3 with backend $4 under $how) failed"; }
    [ -s "$W/$name.rank0.json" ] && [ -s "$W/$name.rank1.json" ] ||
        { tail -30 "$W/$name.log" >&2; fail "$name: no result from both ranks"; }
}

# check RUN REFERENCE BACKEND: RUN's group is BACKEND's, DDP-wrapped, replicas in step; every
# loss and the weights as REFERENCE's within 1e-5 relative
check() {
    "$FW_PY" - "$W/$1" "$W/$2" "$3" <<'PY' || fail "$1 vs $2 (above)"
import json, sys
run, ref, backend = sys.argv[1], sys.argv[2], sys.argv[3]
r = [json.load(open("%s.rank%d.json" % (run, k))) for k in (0, 1)]
g = [json.load(open("%s.rank%d.json" % (ref, k))) for k in (0, 1)]
for k in (0, 1):
    assert r[k]["backend"] == backend, "rank %d's group is %r, not %r" % (k, r[k]["backend"], backend)
    assert r[k]["world"] == 2 and r[k]["distributed"], "rank %d: not a 2-rank DDP job: %s" % (k, r[k])
assert r[0]["weights_sha256"] == r[1]["weights_sha256"], "the two ranks' weights differ: gradients were not averaged"
assert r[0]["losses"] != r[1]["losses"], "both ranks saw the same losses: the data was not sharded"
def close(a, b):
    return abs(a - b) <= 1e-5 * max(abs(b), 1e-3)
worst = 0.0
for k in (0, 1):
    assert len(r[k]["losses"]) == len(g[k]["losses"]) == 8, (len(r[k]["losses"]), len(g[k]["losses"]))
    for i, (a, b) in enumerate(zip(r[k]["losses"], g[k]["losses"])):
        assert close(a, b), "rank %d step %d: loss %.9g vs %.9g in %s" % (k, i, a, b, ref)
        worst = max(worst, abs(a - b) / abs(b))
bad = sum(not close(a, b) for a, b in zip(r[0]["weights"], g[0]["weights"]))
assert not bad, "%d sampled final weights differ from %s's" % (bad, ref)
print("%s: %s group, DDP, losses %.5f -> %.5f as %s's (largest relative difference %.3g), weights %s" % (
    run.rsplit("/", 1)[-1], backend, r[0]["losses"][0], r[0]["losses"][-1], ref.rsplit("/", 1)[-1], worst,
    "bitwise equal" if r[0]["weights_sha256"] == g[0]["weights_sha256"] else "within 1e-5"))
PY
}

sha() { "$FW_PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["weights_sha256"])' "$W/$1.rank0.json"; }

job trainer_gloo launch trainer gloo
job trainer_tandem launch trainer tandem
job trainer_torchrun torchrun trainer tandem
check trainer_gloo trainer_gloo gloo
check trainer_tandem trainer_gloo tandem
check trainer_torchrun trainer_gloo tandem
[ "$(sha trainer_tandem)" = "$(sha trainer_torchrun)" ] ||
    fail "Trainer: torchrun's weights differ from tandem launch's ($(sha trainer_torchrun) vs $(sha trainer_tandem))"

job acc_gloo launch accelerate gloo
job acc_tandem launch accelerate tandem
job acc_torchrun torchrun accelerate tandem
job acc_pre launch accelerate-pre tandem
check acc_gloo acc_gloo gloo
check acc_tandem acc_gloo tandem
check acc_torchrun acc_gloo tandem
check acc_pre acc_gloo tandem
[ "$(sha acc_tandem)" = "$(sha acc_torchrun)" ] ||
    fail "Accelerate: torchrun's weights differ from tandem launch's ($(sha acc_torchrun) vs $(sha acc_tandem))"
echo "PASS"
