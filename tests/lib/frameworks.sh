# The frameworks' tests (tests/python/test_fw_*.sh): a user's Lightning, HF Trainer or
# Accelerate script (examples/) as 2 workers under `tandem run --max-restarts 1`, one worker
# killed by -9 after the first checkpoint. Source after tests/lib/project.sh, then:
#   fw_python                  sets FW_PY to a python that has the frameworks (their venv,
#                              scripts/venv.sh) and tandem from the pip wheel (the fixture
#                              packaging/test_wheel_build), not from the checkout; or exits 77
#                              naming what is missing. Without the wheel (a test run alone, not
#                              through the fixture) the checkout's python/ is used, and it says so.
#                              FW_VENV is the frameworks' venv itself (no tandem in it); FW_WHEEL
#                              the wheel (empty without one).
#   fw_need_wheel              exits 77 (naming the fixture) when there is no wheel: for the
#                              remote legs whose nodes see FW_PY as it is (Slurm's, which hide
#                              neither /root nor the build directory), which then run it with no
#                              PYTHONPATH
#   fw_remote_python FW_SEEN_AS DIR   for the remote legs (ssh hosts, Slurm nodes, EC2
#                              instances), which run the SDK from the wheel only: exits 77 without
#                              one, else prints the python of a venv made at DIR (a place the
#                              remote side sees) with the wheel installed and the frameworks'
#                              venv seen at FW_SEEN_AS (a bind mount of FW_VENV, for hosts to
#                              which /root is hidden; FW_VENV itself where they see it). Made once
#                              per test and reused by its legs; no PYTHONPATH anywhere.
#   fw_run_killed NAME GLOB ARGS...   starts `tandem run --name NAME` of ARGS, waits for a file
#                              matching GLOB in the run's checkpoint directory, kills rank 1 with
#                              -9, waits for the end; the run must succeed with 1 restart
#   fw_check_once RUN KEY MIN_LAST   every step of KEY is stored once, the last is >= MIN_LAST,
#                              and rank 0's metrics file shows the dropped attempt (a resume line)
#   fw_show_has RUN SECTION KEY      `tandem show RUN` lists KEY under "SECTION:"
#   fw_resumed_after RUN STEP  the restarted attempt resumed past STEP (its resume line's step
#                              is >= STEP: it restored a checkpoint, it did not start over)
fw_python() {
    local fw=${TANDEM_FRAMEWORKS_VENV:-$(bash "$SRC/scripts/venv.sh" --print-frameworks)}
    if [ ! -f "$fw/.tandem-requirements" ]; then
        echo "SKIP: the frameworks' venv $fw is not made (scripts/venv.sh makes it; scripts/test.sh runs that)"
        exit 77
    fi
    export OMP_NUM_THREADS=1
    FW_VENV=$fw FW_WHEEL=
    local wheels=("${TANDEM_BUILD_DIR:-/nonexistent}"/packaging/dist/tandem-*.whl)
    if [ -f "${wheels[0]}" ]; then
        FW_WHEEL=${wheels[0]}
        FW_PY=$(fw_overlay "$fw" "${wheels[0]}") || exit 1
        unset PYTHONPATH
        echo "frameworks: $FW_PY (the frameworks' venv, and $(basename "${wheels[0]}") installed)"
    else
        FW_PY=$fw/bin/python
        export PYTHONPATH=$SRC/python
        echo "frameworks: no wheel in ${TANDEM_BUILD_DIR:-?}/packaging/dist (ctest -R packaging/test_wheel_build makes it): the SDK from $SRC/python"
    fi
}

# fw_overlay FW_VENV WHEEL: prints the python of a small venv in the build directory that has the
# wheel installed and sees the frameworks' venv (several GB, kept once per machine and shared by
# every checkout, so no checkout's wheel goes into it) through a .pth file that adds its
# site-packages after its own. Made again only when the wheel's SHA-256 or the frameworks' venv
# changes: a pip install of one local wheel, a few seconds.
fw_overlay() {
    local fw=$1 whl=$2 dir=$TANDEM_BUILD_DIR/packaging/fw-venv stamp
    stamp="$(sha256sum "$whl" | cut -c1-64) $fw"
    mkdir -p "$TANDEM_BUILD_DIR/packaging"
    (
        flock 8
        if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.tandem-wheel" 2>/dev/null)" = "$stamp" ]; then
            exit 0
        fi
        fw_make_overlay "$dir" "$fw" "$whl" "$fw" || exit 1
        echo "$stamp" >"$dir/.tandem-wheel"
    ) 8>"$TANDEM_BUILD_DIR/packaging/.fw-venv.lock" || return 1
    echo "$dir/bin/python"
}

# fw_make_overlay DIR FW_VENV WHEEL FW_SEEN_AS: a fresh venv at DIR (its python is /usr/bin's,
# as the frameworks' venv's is, so it runs wherever /usr is shared) with WHEEL installed and a
# .pth adding the frameworks' site-packages as found under FW_SEEN_AS.
fw_make_overlay() {
    local dir=$1 fw=$2 whl=$3 seen=$4 own theirs
    rm -rf "$dir"
    "$fw/bin/python" -m venv "$dir" >&2 || return 1
    "$dir/bin/python" -m pip install --quiet --no-index --no-deps --disable-pip-version-check "$whl" >&2 ||
        { echo "FAIL: pip install $whl into $dir" >&2; return 1; }
    own=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    theirs=$("$fw/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    # site.addsitedir, not a bare path: the frameworks' own .pth files are read too
    echo "import site; site.addsitedir('$seen${theirs#"$fw"}')" >"$own/zz-tandem-frameworks.pth"
}

fw_need_wheel() {
    if [ -z "${FW_WHEEL:-}" ]; then
        echo "SKIP: the remote legs run the SDK from the pip wheel, and there is none in ${TANDEM_BUILD_DIR:-?}/packaging/dist (ctest -R 'packaging/test_wheel_build|$(basename "$0" .sh)' builds it first)" >&2
        exit 77
    fi
}

fw_remote_python() {
    local seen=$1 dir=$2
    fw_need_wheel
    fw_make_overlay "$dir" "$FW_VENV" "$FW_WHEEL" "$seen" || exit 1
    "$dir/bin/python" - "$dir" "$seen" <<'PY' >&2 || { echo "FAIL: the remote legs' venv $dir is not what they need" >&2; exit 1; }
import importlib.util, os, sys
import tandem
assert os.path.realpath(tandem.__file__).startswith(os.path.realpath(sys.argv[1])), tandem.__file__
torch = importlib.util.find_spec("torch")  # found, not imported: seconds saved
assert torch and torch.origin.startswith(sys.argv[2]), (torch, sys.argv[2])
PY
    echo "frameworks (remote legs): $dir/bin/python, $(basename "$FW_WHEEL") installed, the frameworks' venv seen at $seen" >&2
    echo "$dir/bin/python"
}

fw_worker_pid() { # run rank -> pid of that rank's python (not the /bin/sh in front of it)
    local f p
    for f in $(grep -lz "^TANDEM_RUN_ID=$1\$" /proc/[0-9]*/environ 2>/dev/null |
        xargs -r grep -lz "^RANK=$2\$" 2>/dev/null); do
        p=${f%/environ}
        [[ "$(tr '\0' '\n' <"$p/cmdline" 2>/dev/null | head -1)" == *python* ]] || continue
        echo "${p#/proc/}"
        return 0
    done
    return 1
}

fw_run_killed() {
    local name=$1 glob=$2 i pid rc
    shift 2
    FW_RUN=$name-1
    "$B" run --name "$name" --nproc-per-node 2 --max-restarts 1 -- "$@" >"$name.log" 2>&1 &
    local runner=$!
    local ck=$P/.tandem/runs/$FW_RUN/checkpoints
    for ((i = 0; i < 3000; i++)); do
        compgen -G "$ck/$glob" >/dev/null && break
        kill -0 "$runner" 2>/dev/null || { tail -30 "$name.log" >&2; fail "$name: the run ended before its first checkpoint"; }
        sleep 0.1
    done
    compgen -G "$ck/$glob" >/dev/null || fail "$name: no $glob in $ck after 300 s"
    pid=$(fw_worker_pid "$FW_RUN" 1) || fail "$name: no rank 1 worker of $FW_RUN"
    FW_KILLED_AT=$(ls "$ck" | tr '\n' ' ')
    kill -9 "$pid"
    wait "$runner"
    rc=$?
    [ "$rc" = 0 ] || { tail -40 "$name.log" >&2; fail "$name: tandem run exited $rc"; }
    local show
    show=$("$B" show "$FW_RUN")
    grep -q '^restarts  *1$' <<<"$show" || fail "$name: restarts: $(grep restarts <<<"$show")"
    echo "$name: rank 1 (pid $pid) killed by -9 with $FW_KILLED_AT in the checkpoint directory; run $FW_RUN restarted once and succeeded"
}

fw_check_once() {
    local run=$1 key=$2 min=$3 steps dup last
    steps=$("$B" metrics "$run" --key "$key" --rank 0 --csv | tail -n +2 | cut -d, -f3)
    [ -n "$steps" ] || fail "$run: no $key in the store"
    dup=$(sort -n <<<"$steps" | uniq -d | head -3 | tr '\n' ' ')
    [ -z "$dup" ] || fail "$run: $key stored twice at steps $dup"
    last=$(sort -n <<<"$steps" | tail -1)
    [ "$last" -ge "$min" ] || fail "$run: the last step of $key is $last, expected >= $min"
    grep -q '"event": "resume"' "$P/.tandem/runs/$run/metrics/rank-0.jsonl" ||
        fail "$run: rank 0 wrote no resume line: the restarted attempt did not resume"
    echo "$run: $key at $(wc -l <<<"$steps") steps up to $last, each once; the restart's resume line is in rank 0's metrics"
}

fw_show_has() {
    local section
    section=$(show_section "$1" "$2")
    grep -qE "^  $3 " <<<"$section" || fail "$1: tandem show has no $3 under $2: $(head -20 <<<"$section")"
}

fw_resumed_after() {
    local at
    at=$(grep -o '"event": "resume", "step": -\?[0-9]*' "$P/.tandem/runs/$1/metrics/rank-0.jsonl" |
        tail -1 | grep -o -- '-\?[0-9]*$')
    [ -n "$at" ] && [ "$at" -ge "$2" ] || fail "$1: the restarted attempt resumed at step '${at}', expected >= $2 (a checkpoint's step)"
    echo "$1: the restarted attempt resumed at step $at"
}
