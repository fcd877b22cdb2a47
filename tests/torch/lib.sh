# Shared by tests/torch/test_*.sh: source after setting SRC.
#   torch_setup     sets FW_PY / FW_TORCHRUN (the frameworks venv: PyTorch 2.x) and PYTHONPATH,
#                   TANDEM_BUILD_DIR for `import tandem.torch`; exits 77 naming what is missing
#                   (the venv, or the extension, which the build makes only where torch is found)
#   fail MESSAGE    prints FAIL and exits 1
#   launch_job N ARGS...    N ranks under `tandem launch --nproc-per-node N`
#   torchrun_job N ARGS...  N ranks under torchrun --standalone, with no TANDEM_* variables
fail() { echo "FAIL: $*" >&2; exit 1; }

torch_setup() {
    B=${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}
    BUILD=${TANDEM_BUILD_DIR:?TANDEM_BUILD_DIR must name the build directory}
    local fw=${TANDEM_FRAMEWORKS_VENV:-$(bash "$SRC/scripts/venv.sh" --print-frameworks)}
    if [ ! -f "$fw/.tandem-requirements" ]; then
        echo "SKIP: the frameworks' venv $fw is not made (scripts/venv.sh makes it; scripts/test.sh runs that)"
        exit 77
    fi
    FW_PY=$fw/bin/python
    FW_TORCHRUN=$fw/bin/torchrun
    if ! compgen -G "$BUILD/python/tandem/torch/_tandem_c10d*.so" >/dev/null; then
        echo "SKIP: tandem.torch's extension is not built in $BUILD (configure found no torch: see the 'PyTorch backend extension' line of cmake's output)"
        exit 77
    fi
    export PYTHONPATH=$SRC/python TANDEM_BUILD_DIR=$BUILD OMP_NUM_THREADS=1
    unset TANDEM_TORCH_EXT
}

launch_job() {
    local n=$1
    shift
    "$B" launch --nproc-per-node "$n" -- "$@"
}

torchrun_job() {
    local n=$1
    shift
    env -u TANDEM_STORE_ADDR -u TANDEM_TOKEN -u TANDEM_RUN_ID -u TANDEM_HEARTBEAT_MS \
        "$FW_TORCHRUN" --standalone --nproc-per-node "$n" "$@"
}
