#!/usr/bin/env bash
# An epoch whose size the global batch does not divide: 1000 training samples (the first 1000 of
# Fashion-MNIST, written here as a small IDX dataset), global batch 14 = 7 x 2 ranks, so the
# epoch is 71 full steps and a tail of 6 samples that lands entirely on rank 0's slot (rank 1's
# slot is empty and contributes zero gradient). One epoch with 2 workers (--batch 7) and with 1
# process (--batch 7 --accum 2): both finish (no rank waits for a peer that has no data), both
# report the same step count ceil(1000/14) = 72 and 1 epoch, and the weights are bitwise equal.
# The tail step must matter: stopping after the 71 full steps gives different weights.
set -uo pipefail
: "${TANDEM_BIN:?}" "${TANDEM_DATA:?}"
PY=${PYTHON:-/usr/bin/python3}
work=$(mktemp -d /tmp/tandem-ddp-tail-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() {
    echo "FAIL: $*" >&2
    for f in "$work"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -15 "$f" >&2; }; done
    exit 1
}
N=1000 NTEST=100 B=7

# The first N / NTEST samples of the real data; train as plain IDX, test gzip-compressed (the
# reader takes both).
"$PY" - "$TANDEM_DATA" "$work/data" $N $NTEST <<'EOF' || fail "could not write the small dataset"
import gzip, os, struct, sys
src, dst, n_train, n_test = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
os.makedirs(dst)
for split, n, compress in (("train", n_train, False), ("t10k", n_test, True)):
    for kind, magic in (("images-idx3", 0x803), ("labels-idx1", 0x801)):
        with gzip.open(f"{src}/{split}-{kind}-ubyte.gz", "rb") as f:
            data = f.read()
        (m, count), ndims = struct.unpack(">II", data[:8]), data[3]
        assert m == magic, (split, kind, hex(m))
        dims = struct.unpack(">" + "I" * ndims, data[4:4 + 4 * ndims])
        per = 1
        for d in dims[1:]:
            per *= d
        body = data[4 + 4 * ndims:4 + 4 * ndims + n * per]
        out = struct.pack(">I", magic) + struct.pack(">" + "I" * ndims, n, *dims[1:]) + body
        name = f"{dst}/{split}-{kind}-ubyte"
        if compress:
            with gzip.open(name + ".gz", "wb") as g:
                g.write(out)
        else:
            with open(name, "wb") as g:
                g.write(out)
EOF

common=(--model basicnet --data "$work/data" --epochs 1 --seed 5 --threads 1 --lr 1e-3 --no-progress
        --json)
json_field() { # FILE KEY: the value of KEY in the last JSON line of FILE
    "$PY" -c 'import json,sys; print(json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])[sys.argv[2]])' "$1" "$2"
}

timeout -k 5 300 "$TANDEM_BIN" train "${common[@]}" --nproc-per-node 2 --batch $B \
    --save "$work/w2.safetensors" >"$work/2.out" 2>"$work/2.log" ||
    fail "2 workers: exit $? (a hang ends in timeout's 124)"
sed 's/^\[rank 0\] //' "$work/2.out" >"$work/2.json"
timeout -k 5 300 "$TANDEM_BIN" train "${common[@]}" --batch $B --accum 2 \
    --save "$work/w1.safetensors" >"$work/1.json" 2>"$work/1.log" || fail "1 process: exit $?"

want_steps=$(( (N + 2 * B - 1) / (2 * B) ))
for run in 1 2; do
    steps=$(json_field "$work/$run.json" steps) || fail "no JSON line from the $run-process run"
    epochs=$(json_field "$work/$run.json" epochs)
    gb=$(json_field "$work/$run.json" global_batch)
    [ "$steps" = "$want_steps" ] || fail "$run process(es): $steps steps, expected $want_steps"
    [ "$epochs" = 1 ] || fail "$run process(es): $epochs epochs, expected 1"
    [ "$gb" = $((2 * B)) ] || fail "$run process(es): global batch $gb, expected $((2 * B))"
done
# Every sample of the epoch trained exactly once: none dropped with the tail, none repeated.
for run in 1 2; do
    seen=$(json_field "$work/$run.json" samples) || fail "the $run-process JSON has no 'samples'"
    [ "$seen" = $N ] || fail "$run process(es) trained on $seen samples in one epoch of $N"
done
ws=$(json_field "$work/2.json" world_size)
[ "$ws" = 2 ] || fail "the 2-worker run reports world_size $ws"
echo "1 and 2 processes: $want_steps steps of global batch $((2 * B)) over $N samples" \
     "($((want_steps - 1)) x $((2 * B)) + a tail of $((N - (want_steps - 1) * 2 * B)))"
cmp "$work/w1.safetensors" "$work/w2.safetensors" ||
    fail "weights after one uneven epoch differ between 2 workers and 1 process with --accum 2"

# Without the tail step the weights are different: the 6 samples of the tail were trained on.
short=("${common[@]}")
for i in "${!short[@]}"; do [ "${short[$i]}" = --epochs ] && short[$i]=--steps && short[$((i + 1))]=$((want_steps - 1)); done
"$TANDEM_BIN" train "${short[@]}" --batch $B --accum 2 --save "$work/w71.safetensors" \
    >"$work/71.json" 2>"$work/71.log" || fail "the $((want_steps - 1))-step run failed"
if cmp -s "$work/w71.safetensors" "$work/w1.safetensors"; then
    fail "the tail step did not change the weights"
fi
echo "uneven tail: no hang, bitwise-equal weights, and the tail step counts"
