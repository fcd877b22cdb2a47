# An EC2 account on this machine for tests (the `executor: aws` tests): moto's server is the EC2
# API, and every instance it reports running is an ssh host of tests/lib/sshd.sh (own network,
# UTS, mount and PID namespaces, own sshd, hostname = the instance id, address = the instance's
# private IP) with an IMDSv2 server at 169.254.169.254 inside it (cloud_imds.py) and its user
# data script run there as root. docs/cloud.md ("The test fixture") says what it simulates and
# what not. Source this file, set an EXIT trap that calls
# cloud_down, then call
#   cloud_up [HIDE_DIR...]
# which makes the login namespace and bridge of sshd.sh with no host (sshd_up 0 HIDE_DIR...: every
# instance's host sees an empty tmpfs there, as a machine of its own would), gives the
# bridge 172.31.0.1/16 (moto's default VPC is 172.31.0.0/16; its default subnets are /20s in it),
# and starts there: moto_server on 172.31.0.1:5000, the proxy (cloud_proxy.py) on
# 172.31.0.1:4566 and the watcher (cloud_watch.py). It exports
#   CLOUD_ENDPOINT        http://172.31.0.1:4566, the EC2 endpoint for the test's clients (the
#                         proxy: capacity refusals, default subnets); reachable from the login
#                         namespace (sshd_exec) and from every instance, not from the root one
#   CLOUD_MOTO_ENDPOINT   moto itself, http://172.31.0.1:5000 (no refusal, no default subnet)
#   AWS_ENDPOINT_URL      = CLOUD_ENDPOINT (botocore >= 1.31 and the AWS CLI read it)
#   AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY (anything: moto checks nothing),
#   AWS_DEFAULT_REGION=us-east-1, AWS_CONFIG_FILE=AWS_SHARED_CREDENTIALS_FILE=/dev/null,
#   AWS_EC2_METADATA_DISABLED=true (the clients of the login namespace have no IMDS)
#   CLOUD_VENV CLOUD_PYTHON CLOUD_AWS  the venv, its python (boto3) and its aws CLI
#   CLOUD_AMI             an image moto knows (run-instances needs one)
#   CLOUD_SUBNETS CLOUD_AZS  (arrays) the default subnets of us-east-1 and their zones
# and TSH_STATE etc. as sshd_up does. Clients run in the login namespace: sshd_exec CMD...
# (`sshd_exec ssh <private-ip or instance-id> CMD` reaches an instance). Then
#   cloud_wait_host ID [SECS=30]   waits until instance ID's host answers ssh and IMDS
#   cloud_wait_gone ID [SECS=30]   waits until its host is torn down
#   cloud_hosts                    prints "ID ADDRESS" per host that is up
#   cloud_host_exec ID CMD...      runs CMD in ID's namespaces (sshd_host_exec)
#   cloud_interrupt ID [SECS=120]  the spot interruption: its IMDS answers
#                                  meta-data/spot/instance-action {"action": "terminate",
#                                  "time": now+SECS}; SECS later the watcher terminates ID in moto
#                                  (and so tears its host down), and DescribeInstances through
#                                  CLOUD_ENDPOINT gives it the state reason
#                                  Server.SpotInstanceTermination
#   cloud_rebalance ID             its IMDS answers meta-data/events/recommendations/rebalance
#   cloud_refuse_capacity [SUBNET_ID|AZ|INSTANCE_TYPE...]  RunInstances through CLOUD_ENDPOINT
#                                  in those is answered InsufficientInstanceCapacity (HTTP 500,
#                                  nothing made); no argument: no refusal
#   an instance's shutdown from inside: tests/lib/cloud_shutdown.sh (set TANDEM_SHUTDOWN_CMD to
#                                  it: never a real shutdown) posts to its IMDS, and the watcher
#                                  terminates or stops it in moto as its
#                                  InstanceInitiatedShutdownBehavior says, recording
#                                  "BEHAVIOUR TIME WHY" in $TSH_STATE/cloud/shutdown/ID
#   cloud_spot_prices ["TYPE ZONE USD"...]  DescribeSpotPriceHistory through CLOUD_ENDPOINT
#                                  answers these prices for those types and zones, none in the
#                                  other zones of a type named here, and moto's own (the same in
#                                  every zone) for the other types; no argument: moto's
#   cloud_logs [LINES]             the tails of the watcher's, proxy's, moto's and sshd's logs
#   cloud_down                     idempotent: the watcher, proxy, moto and every host killed,
#                                  every namespace deleted (nothing is "terminated" in moto)
# cloud_up exits 77 (skip) with the reason when not root, when namespaces are unavailable (as
# sshd_up does) or when the venv (${TANDEM_VENV:-$TANDEM_SOURCE_DIR/.venv}, scripts/venv.sh)
# lacks moto's server or boto3; it returns 1 with the logs when moto or the watcher does not
# come up within 60 s. Leftovers of a killed earlier test are removed by sshd_up; the watcher
# also tears its fixture down itself when its test process is gone.

_cloud_lib=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$_cloud_lib/sshd.sh"

CLOUD_GATEWAY=172.31.0.1
CLOUD_MOTO_PORT=5000
CLOUD_PROXY_PORT=4566

cloud_logs() {
    local f
    for f in "${TSH_STATE:-/nonexistent}"/log/{cloud-watch,cloud-proxy,moto}.log; do
        [ -s "$f" ] && { echo "--- $f" && tail -n "${1:-20}" "$f"; } >&2
    done
    sshd_logs "${1:-20}"
}

_cloud_fail() { echo "cloud_up: $*" >&2; cloud_logs 20; return 1; }

cloud_up() {
    local src venv st login t0=$SECONDS line
    src=${TANDEM_SOURCE_DIR:-$(cd "$_cloud_lib/../.." && pwd)}
    venv=${TANDEM_VENV:-$src/.venv}
    [ -x "$venv/bin/moto_server" ] && [ -x "$venv/bin/python" ] ||
        { echo "SKIP: no moto_server in the venv $venv (scripts/venv.sh makes it)"; exit 77; }
    "$venv/bin/python" -c 'import boto3, moto' 2>/dev/null ||
        { echo "SKIP: the venv $venv lacks boto3 or moto (scripts/venv.sh)"; exit 77; }
    sshd_up 0 "$@" || return 1
    st=$TSH_STATE login=tsh-$$-login
    mkdir "$st/cloud" && : >"$st/cloud/refuse" || _cloud_fail "cannot write $st/cloud" || return 1
    ip -n "$login" addr add "$CLOUD_GATEWAY/16" dev br0 ||
        _cloud_fail "cannot give the bridge $CLOUD_GATEWAY/16" || return 1
    export CLOUD_VENV=$venv CLOUD_PYTHON=$venv/bin/python CLOUD_AWS=$venv/bin/aws
    export CLOUD_MOTO_ENDPOINT=http://$CLOUD_GATEWAY:$CLOUD_MOTO_PORT
    export CLOUD_ENDPOINT=http://$CLOUD_GATEWAY:$CLOUD_PROXY_PORT
    export AWS_ENDPOINT_URL=$CLOUD_ENDPOINT
    export AWS_ACCESS_KEY_ID=fixture AWS_SECRET_ACCESS_KEY=fixture AWS_DEFAULT_REGION=us-east-1
    export AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_EC2_METADATA_DISABLED=true
    unset AWS_PROFILE AWS_SESSION_TOKEN AWS_REGION

    # moto and the proxy in the login namespace (killed with it); the watcher in its network
    # namespace only, so that it sees the hosts' namespaces that sshd_add_host makes later.
    # as EC2 does: an unknown key pair or instance type is refused
    _tsh_bg "$st/log/moto.log" nsenter -t "$(cat "$st/login.pid")" -n -u -m -- \
        env MOTO_ENABLE_KEYPAIR_VALIDATION=true MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION=true \
        "$venv/bin/moto_server" -H "$CLOUD_GATEWAY" -p "$CLOUD_MOTO_PORT" >"$st/cloud/moto.pid"
    _tsh_bg "$st/log/cloud-proxy.log" nsenter -t "$(cat "$st/login.pid")" -n -u -m -- \
        /usr/bin/python3 "$_cloud_lib/cloud_proxy.py" "$CLOUD_GATEWAY" "$CLOUD_PROXY_PORT" \
        "$CLOUD_GATEWAY" "$CLOUD_MOTO_PORT" "$st/cloud/refuse" >"$st/cloud/proxy.pid"
    TSH_STATE=$st CLOUD_LIB=$_cloud_lib _tsh_bg "$st/log/cloud-watch.log" \
        nsenter --net="/run/netns/$login" -- "$venv/bin/python" "$_cloud_lib/cloud_watch.py" "$st" $$ \
        >"$st/cloud/watch.pid"
    # the watcher writes cloud/info once moto answers it
    until [ -s "$st/cloud/info" ]; do
        _tsh_alive "$(cat "$st/cloud/moto.pid")" || _cloud_fail "moto_server exited" || return 1
        _tsh_alive "$(cat "$st/cloud/watch.pid")" || _cloud_fail "the watcher exited" || return 1
        [ $((SECONDS - t0)) -lt 60 ] || _cloud_fail "moto did not answer within 60 s" || return 1
        sleep 0.1
    done
    sshd_wait 10 "the proxy" sshd_exec bash -c "exec 3<>/dev/tcp/$CLOUD_GATEWAY/$CLOUD_PROXY_PORT" ||
        _cloud_fail "the proxy does not listen" || return 1
    CLOUD_SUBNETS=() CLOUD_AZS=()
    while read -r -a line; do
        case ${line[0]} in
        ami) CLOUD_AMI=${line[1]} ;;
        subnet) CLOUD_SUBNETS+=("${line[1]}") CLOUD_AZS+=("${line[2]}") ;;
        esac
    done <"$st/cloud/info"
    export CLOUD_AMI
}

cloud_down() {
    local f
    [ -n "${TSH_STATE:-}" ] || return 0
    # the watcher first, so that it makes no host while the rest goes
    for f in "$TSH_STATE"/cloud/{watch,proxy,moto}.pid; do
        [ -s "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null
    done
    sshd_down
    _tsh_teardown $$ # a host the watcher's last sshd_add_host made while the first one listed
}

_cloud_dir() {
    [ -n "${TSH_STATE:-}" ] || { echo "cloud: no fixture (cloud_up first)" >&2; return 1; }
    [ -d "$TSH_STATE/cloud/$1" ] && [ -n "$1" ] ||
        { echo "cloud: no host for instance '$1'" >&2; return 1; }
    echo "$TSH_STATE/cloud/$1"
}

cloud_wait_host() {
    sshd_wait "${2:-30}" "the host of instance $1" test -e "${TSH_STATE:-/nonexistent}/cloud/$1/ready"
}

cloud_wait_gone() {
    sshd_wait "${2:-30}" "the host of instance $1 to go" sh -c \
        "[ ! -e '${TSH_STATE:-/nonexistent}/cloud/$1' ] && ! grep -qx '$1' '${TSH_STATE:-/nonexistent}'/h*/name"
}

cloud_hosts() {
    local f
    for f in "${TSH_STATE:-/nonexistent}"/cloud/*/ready; do
        [ -e "$f" ] || continue
        f=${f%/ready}
        echo "${f##*/} $(cut -d' ' -f1 "$f/ready")"
    done
}

cloud_host_exec() {
    local i
    i=$(sshd_host_index "$1") || return 1
    shift
    sshd_host_exec "$i" "$@"
}

# _cloud_post FILE TEXT: atomically (the IMDS reads it at every request)
_cloud_post() { printf '%s' "$2" >"$1.tmp" && mv "$1.tmp" "$1"; }

cloud_interrupt() {
    local d secs=${2:-120} now
    d=$(_cloud_dir "${1:-}") || return 1
    [[ $secs =~ ^[0-9]+$ ]] || { echo "cloud_interrupt: SECONDS, not '$secs'" >&2; return 1; }
    now=$(date +%s.%N)
    # EC2's time has whole seconds: the next one at or after the termination
    _cloud_post "$d/spot-instance-action" \
        "{\"action\": \"terminate\", \"time\": \"$(date -u -d "@$((${now%.*} + secs + 1))" +%Y-%m-%dT%H:%M:%SZ)\"}"
    _cloud_post "$d/terminate-at" "$((${now%.*} + secs)).${now#*.}"
}

cloud_rebalance() {
    local d
    d=$(_cloud_dir "${1:-}") || return 1
    _cloud_post "$d/rebalance" "{\"noticeTime\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\"}"
}

cloud_spot_prices() {
    [ -n "${TSH_STATE:-}" ] || { echo "cloud: no fixture (cloud_up first)" >&2; return 1; }
    local what
    what=$(for w; do echo "$w"; done)
    _cloud_post "$TSH_STATE/cloud/spot-prices" "${what:+$what
}"
}

cloud_refuse_capacity() {
    [ -n "${TSH_STATE:-}" ] || { echo "cloud: no fixture (cloud_up first)" >&2; return 1; }
    local what
    what=$(for w; do echo "$w"; done)
    _cloud_post "$TSH_STATE/cloud/refuse" "${what:+$what
}"
}

# cloud_test_begin NAME: the start every test on the fixture shares. P: a new directory
# /tmp/tandem-NAME-XXXXXX (hide it from the instances: the test's project lives there), removed
# at exit; TANDEM_HOME=$P; an EXIT trap that runs the test's own cloud_test_cleanup when it
# defines one, then cloud_down; the fixture up. Defines
#   fail MSG                 says FAIL: MSG, the tails of $P/*.log, the test's cloud_test_logs
#                            when it defines one, the fixture's logs; exit 1
#   aws ARGS...              the fixture's AWS CLI, in the login namespace
#   cloud_tagged KEY VALUE [STATES]  ids of the instances tagged KEY=VALUE, one per line, sorted,
#                            in STATES (default: pending,running,stopping,stopped)
cloud_test_begin() {
    P=$(mktemp -d "/tmp/tandem-$1-XXXXXX")
    export TANDEM_HOME=$P
    _cloud_test_end() {
        if declare -F cloud_test_cleanup >/dev/null; then cloud_test_cleanup; fi
        cloud_down
        rm -rf "$P"
    }
    trap _cloud_test_end EXIT
    fail() {
        echo "FAIL: $*" >&2
        local f
        for f in "$P"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -25 "$f" >&2; }; done
        if declare -F cloud_test_logs >/dev/null; then cloud_test_logs >&2; fi
        cloud_logs 10
        exit 1
    }
    aws() { sshd_exec "$CLOUD_AWS" "$@"; }
    cloud_tagged() {
        aws ec2 describe-instances --filters "Name=tag:$1,Values=$2" \
            "Name=instance-state-name,Values=${3:-pending,running,stopping,stopped}" \
            --query 'Reservations[].Instances[].InstanceId' --output text |
            tr '\t' '\n' | sed '/^$/d' | sort
    }
    cloud_up "$P" || fail "the fixture did not come up"
}
