#!/usr/bin/env bash
# A spot replacement's time, from the interruption notice to the replacement's first resumed step
# (issue 31), on the EC2 fixture (tests/lib/cloud.sh: moto, every instance a namespace host with
# its own sshd and IMDS; root, namespaces and the venv), for the two ways an instance gets tandem,
# measured in the same invocation:
#   in the image  aws.tandem names a tandem the instances have (the fixture's instances see this
#                 machine's build tree: an image with tandem baked in), no setup: the before
#   shipped       no aws.tandem: the submitter's bundle (src/exec/bundle.c) goes to each new
#                 instance over ssh, the replacement included (a fresh instance: a real send)
# Each run: 2 spot nodes train BasicNet with checkpoints every 10 steps in S3; once step 20 is
# committed, node 1 gets a notice 40 s ahead; the time is the resumed attempt's first train/loss
# point's time minus the notice's. With FROM_SOURCE=1 a third way is measured too, the one an
# image without tandem had before shipping: aws.setup builds tandem from this source tree on each
# new instance, the replacement included (configure and compile into the instance's own /root;
# the Debian packages are the machine's, so apt's minutes are not in it: a lower bound). It takes
# minutes (the two first nodes build too, untimed). Figures are printed, never asserted.
#   TANDEM_BUILD_DIR=build [FROM_SOURCE=1] bash bench/bench_replace.sh [REPEATS=1]
set -uo pipefail
cd "$(dirname "$0")/.."
SRC=$(pwd)
B=$(cd "${TANDEM_BUILD_DIR:-build}" && pwd)/tandem
DATA=${TANDEM_DATA:-/usr/share/datasets/fashion-mnist}
reps=${1:-1}
[ -x "$B" ] || { echo "bench_replace: $B is missing; build first" >&2; exit 1; }
export TANDEM_SOURCE_DIR=$SRC
. "$SRC/tests/lib/cloud.sh"
P=$(mktemp -d /tmp/tandem-bench-replace-XXXXXX)
trap 'cloud_down; rm -rf "$P"' EXIT
export TANDEM_HOME=$P XDG_CACHE_HOME=$P/cache
cloud_up "$P" || { echo "bench_replace: the fixture did not come up" >&2; exit 1; }
aws() { sshd_exec "$CLOUD_AWS" "$@"; }
aws ec2 create-key-pair --key-name tk --query KeyName --output text >/dev/null
aws s3 mb s3://bench >/dev/null
mkdir -p "$P/.tandem"
train="tandem train --model basicnet --data $DATA --batch 32 --threads 1 --seed 7 --no-progress --steps 200"
blk="instance_type: t3.micro, image: $CLOUD_AMI, key_name: tk, user: root, spot: true, address: private"
wf() { # NAME EXTRA
    cat <<EOF
  - name: $1
    executor: aws
    nodes: 2
    aws: {$blk$2}
    checkpoint_dir: s3://bench/$1
    command: $train --checkpoint-dir "\$TANDEM_CHECKPOINT_DIR" --checkpoint-every 10
EOF
}
src_build=/root/tandem-src-build # each instance's own /root: a replacement builds again
{
    echo "workflows:"
    wf image ", tandem: $B"
    wf shipped ""
    wf source ", tandem: $src_build/tandem, setup: [\"cmake -S $SRC -B $src_build -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build $src_build -j$(nproc) --target tandem >/dev/null\"]"
} >"$P/.tandem/workflows.yaml"

measure() { # NAME: prints the seconds from the notice to the first resumed step
    local name=$1 n run sup before old1 t_notice after t_first
    n=$(($(ls "$P/.tandem/runs" 2>/dev/null | grep -c "^$name-") + 1))
    run=$name-$n
    sshd_exec timeout -k 5 2400 "$B" run "$name" >"$P/$run.log" 2>&1 &
    sup=$!
    commits() { aws s3 ls "s3://bench/$name/$run/" | sed -n 's/.*ckpt-\([0-9]*\)\.tdck\.commit$/\1/p' | sort -n; }
    for _ in $(seq 1 1500); do
        before=$(commits | tail -1)
        [ -n "$before" ] && [ "$before" -ge 20 ] && break
        kill -0 $sup 2>/dev/null || { echo "bench_replace: $run ended early: $(tail -3 "$P/$run.log")" >&2; return 1; }
        sleep 0.2
    done
    old1=$(aws ec2 describe-instances --filters "Name=tag:tandem:run,Values=$run" Name=tag:tandem:node,Values=1 \
        Name=instance-state-name,Values=running --query 'Reservations[].Instances[].InstanceId' --output text)
    t_notice=$(date +%s.%N)
    cloud_interrupt "$old1" 40 >/dev/null
    wait $sup || { echo "bench_replace: $run failed: $(tail -5 "$P/$run.log")" >&2; return 1; }
    # the resumed attempt's first step: one past the step it resumed from (rank 0's log says it)
    after=$(sed -n 's/.*resuming from .*ckpt-\([0-9]*\)\.tdck.*/\1/p' "$P/.tandem/runs/$run/logs/rank-0.log" | tail -1)
    t_first=$("$B" metrics "$run" --key train/loss --csv | awk -F, -v s=$((after + 1)) '$3 == s {print $5; exit}')
    awk "BEGIN{printf \"%.1f\", $t_first - $t_notice}"
}

echo "bench_replace: $(nproc) cores; $(uptime)"
printf '%-10s %-10s %s\n' "run" "tandem" "notice_to_resumed_step_s"
for r in $(seq 1 "$reps"); do
    img=$(measure image) || exit 1
    printf '%-10s %-10s %s\n' "$r" "in-image" "$img"
    shp=$(measure shipped) || exit 1
    printf '%-10s %-10s %s\n' "$r" "shipped" "$shp"
    grep -h "tandem shipped to\|has this tandem already\|tandem ships to" "$P"/shipped-*.log | tail -3 | sed 's/^/  /'
    awk "BEGIN{printf \"  shipped / in-image: %.2f\n\", $shp / $img}"
    if [ "${FROM_SOURCE:-0}" = 1 ]; then
        src=$(measure source) || exit 1
        printf '%-10s %-10s %s\n' "$r" "source" "$src"
        awk "BEGIN{printf \"  source / shipped: %.1f\n\", $src / $shp}"
    fi
done
