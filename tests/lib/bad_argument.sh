# A run whose worker on one node fails on a bad argument (`tandem train --lr abc`, exit 2): its
# record must say so from that node's end record (include/tandem/endrec.h), on any carrier.
#   expect_bad_argument RUN NODE   the run's exit code is the worker's 2, its note names the
#                                  worker (rank 1, on node NODE) and carries its own error line,
#                                  and RUN/end/node-NODE.json arrived. Needs $B, $P and fail().
expect_bad_argument() {
    local run=$1 node=$2 show note
    show=$("$B" show "$run")
    note=$(sed -n 's/^note  *//p' <<<"$show")
    grep -q '^exit code  *2$' <<<"$show" || fail "$run: exit code is not the worker's 2: $show"
    grep -q "worker rank 1 .*on node $node.* exited with code 2: tandem train: --lr 'abc'" <<<"$note" ||
        fail "$run: the note lacks the failing worker's own error line: '$note'"
    [ -f "$P/.tandem/runs/$run/end/node-$node.json" ] || fail "$run: node $node's end record did not arrive"
}
