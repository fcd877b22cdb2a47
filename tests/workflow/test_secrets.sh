#!/usr/bin/env bash
# workflow: `secrets: [NAME, ...]` in a workflow (issue 18). A secret's value comes from tandem
# run's own environment and reaches the workers' environment without being written anywhere.
#   1. local: 2 workers see MY_TOKEN (each writes its SHA-256 to an artifact, equal to the
#      value's), while the value is on no process's command line during the run (launchers,
#      workers, tandem run: every /proc/PID/cmdline of the machine), the launchers have it in
#      their environment, and afterwards it is in no file under the project's .tandem (run
#      directory, runs.db, logs, run.json), nor in `tandem show`, `tandem logs` or run's output.
#   2. an unset secret fails before anything starts, naming it, the fix and the workflow file;
#      a bad name, a TANDEM_* name, and a name env: also sets fail when the file is parsed.
#   3. slurm, without a cluster: a fake sbatch records what it was given; it has the secret in
#      its environment and --export=ALL on its command line, and the batch script has the name
#      only (shared run directory, and slurm: work_dir).
#   4. ssh (tests/lib/sshd.sh, one host that sees neither the project nor our environment): the
#      remote worker sees the secret (its hash comes back as the artifact), the value is on no
#      command line while it runs, and neither the remote run directory nor ours holds it.
#      Skipped, saying why, where the fixture cannot run (not root, no sshd).
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
. "$SRC/tests/lib/project.sh"
project_init secrets
PAT=$(mktemp /tmp/tandem-secret-pattern-XXXXXX) # the value, for grep -f: never on a command line
GO=$(mktemp -d /tmp/tandem-secret-go-XXXXXX)    # where the workers wait to be let go
ui=
trap '[ -z "$ui" ] || kill $ui 2>/dev/null; project_cleanup; rm -rf "$PAT" "$GO"' EXIT

VALUE="tdsecret-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
printf '%s\n' "$VALUE" >"$PAT"
WANT=$(printf %s "$VALUE" | sha256sum | cut -c1-64)
export MY_TOKEN=$VALUE

# No file under DIR holds the value (binary files too: runs.db); fails naming them.
no_copy_in() {
    local hits
    hits=$(grep -rlaF -f "$PAT" "$1" 2>/dev/null)
    [ -z "$hits" ] || fail "the secret's value is in: $hits"
}
# No process's command line holds it (launchers, workers, ssh, tandem run; grep reads the
# pattern from a file, so its own does not).
no_cmdline() {
    local hits
    hits=$(grep -laF -f "$PAT" /proc/[0-9]*/cmdline 2>/dev/null)
    [ -z "$hits" ] || fail "the secret's value is on the command line of $hits: $(tr '\0' ' ' <"${hits%%$'\n'*}")"
}

mkdir -p .tandem
cat >.tandem/workflows.yaml <<EOF
workflows:
  - name: sec
    secrets: [MY_TOKEN]
    nproc_per_node: 2
    command: |
      mkdir -p out
      printf %s "\$MY_TOKEN" | sha256sum | cut -c1-64 > out/hash-\$RANK.txt
      touch "$GO/started-\$RANK"
      while [ ! -e "$GO/go" ]; do sleep 0.05; done
    artifacts: [out/hash-*.txt]
  - name: unset
    secrets: [TD_TEST_UNSET_SECRET]
    command: "true"
EOF

# --- 1. local
"$B" run sec >run.log 2>&1 &
sup=$!
for _ in $(seq 300); do
    [ -e "$GO/started-0" ] && [ -e "$GO/started-1" ] && break
    kill -0 $sup 2>/dev/null || fail "the run ended before its workers started: $(cat run.log)"
    sleep 0.1
done
[ -e "$GO/started-0" ] && [ -e "$GO/started-1" ] || fail "the workers did not start: $(cat run.log)"
no_cmdline
# the launchers are tandem run's children; the secret is in their environment, where the
# workers got it from
launchers=$(pgrep -P $sup -f ' launch ') || fail "no launcher under tandem run ($sup)"
for l in $launchers; do
    tr '\0' '\n' <"/proc/$l/environ" | grep -qxF "MY_TOKEN=$VALUE" ||
        fail "launcher $l does not have MY_TOKEN in its environment"
done
touch "$GO/go"
wait $sup || fail "tandem run sec: exit $?: $(cat run.log)"
R=.tandem/runs/sec-1
for r in 0 1; do
    got=$(cat "$R/artifacts/out/hash-$r.txt" 2>/dev/null)
    [ "$got" = "$WANT" ] || fail "rank $r saw a MY_TOKEN whose sha256 is '$got', want $WANT"
done
echo "ok: both local workers saw MY_TOKEN (sha256 in the artifacts), and it was on no command line"
no_copy_in .tandem
grep -qaF -f "$PAT" run.log && fail "tandem run printed the secret's value"
"$B" show sec-1 >show.txt 2>&1 || fail "tandem show sec-1: $(cat show.txt)"
"$B" logs sec-1 >>show.txt 2>&1
"$B" ps -a >>show.txt 2>&1
grep -qaF -f "$PAT" show.txt && fail "tandem show/logs/ps print the secret's value"
# the UI's API: the run, its list entry, a rank's log
"$B" ui --port 0 >ui.out 2>&1 &
ui=$!
for _ in $(seq 100); do grep -q '^tandem ui: http' ui.out && break; sleep 0.1; done
url=$(sed -n 's#^tandem ui: \(http://[^/]*\)/.*#\1#p' ui.out)
token=$(sed -n 's#^tandem ui: http://.*?token=\([0-9a-f]*\)$#\1#p' ui.out) # every request needs it
[ -n "$url" ] || fail "tandem ui did not start: $(cat ui.out)"
for path in "/api/runs?all=1" /api/runs/sec-1 "/api/runs/sec-1/logs/0?tail=1000"; do
    curl -sf -H "X-Tandem-Token: $token" "$url$path" >api.json || fail "GET $path: $(cat ui.out)"
    grep -q 'sec-1' api.json || [ "${path#*/logs/}" != "$path" ] || fail "GET $path: $(head -c 300 api.json)"
    [ -s api.json ] || fail "GET $path: empty"
    grep -qaF -f "$PAT" api.json && fail "GET $path has the secret's value"
done
kill $ui
wait $ui 2>/dev/null
ui=
echo "ok: the value is in no file under .tandem, nor in tandem run's output, show, logs, ps or the UI's API"

# --- 2. errors before anything starts
unset TD_TEST_UNSET_SECRET
"$B" run unset >unset.log 2>&1 && fail "a run with an unset secret started"
want="workflow 'unset': secret TD_TEST_UNSET_SECRET is not set in tandem run's environment: export it, or remove it from secrets:"
grep -qF "$want" unset.log || fail "unset secret: got '$(cat unset.log)', want '$want'"
grep -qF ".tandem/workflows.yaml" unset.log || fail "the error does not name the file: $(cat unset.log)"
"$B" ps -a | grep -q '^unset-' && fail "the run with an unset secret was created: $("$B" ps -a)"
echo "ok: an unset secret fails before the run exists: $(cat unset.log)"

bad() { # FILE-TEXT WANT: tandem run -f refuses it at parse, exit 2, with WANT in the message
    printf '%s\n' "$1" >bad.yaml
    "$B" run -f bad.yaml x >bad.log 2>&1
    local rc=$?
    [ $rc = 2 ] || fail "tandem run of '$1': exit $rc (want 2): $(cat bad.log)"
    grep -qF "$2" bad.log || fail "tandem run of '$1': got '$(cat bad.log)', want '$2'"
    echo "ok: refused at parse: $(head -1 bad.log)"
}
bad 'workflows: [{name: x, command: "true", secrets: [1BAD]}]' \
    "secrets: '1BAD' cannot be a secret: expected the name of an environment variable"
grep -q "bad.yaml:1:[0-9]*: secrets:" bad.log || fail "the parse error does not point into the file: $(cat bad.log)"
bad 'workflows: [{name: x, command: "true", secrets: [A-B]}]' "secrets: 'A-B' cannot be a secret"
bad 'workflows: [{name: x, command: "true", secrets: [TANDEM_TOKEN]}]' \
    "'TANDEM_TOKEN' cannot be a secret"
bad 'workflows: [{name: x, command: "true", secrets: [A, A]}]' "secrets: 'A' appears twice"
bad 'workflows: [{name: x, command: "true", env: {K: v}, secrets: [K]}]' \
    "workflow 'x' sets K under env: and names it under secrets:; keep one"
bad 'workflows: [{name: x, command: "true", secrets: {K: v}}]' \
    "secrets: expected a string or a list of strings"

# the agent's side of the ssh opening (tandem launch --forward-stdio): a malformed secret line
# is refused naming the variable, never echoing the value; a good one (8 KiB, the most) reaches
# the worker
agent() { # OPENING-LINE WORKER-SCRIPT: the agent's stderr (its stdin stays open 2 s: its end
    # stops the agent)
    rm -rf agentlogs
    { printf '%s\ngo\n' "$1"; sleep 2; } | timeout 20 "$B" launch --forward-stdio \
        --log-dir "$PWD/agentlogs" --standalone --nproc-per-node 1 -- sh -c "$2" 2>&1 >/dev/null
}
for line in 'secret BAD 4142434g' 'secret 1X 41424344' 'secret X 4142430044' 'secret X 4142434' \
    'secret X'; do
    out=$(agent "$line" true)
    grep -qF "link: a 'secret' line from the supervisor must be 'secret NAME HEX'" <<<"$out" ||
        fail "the agent took '$line': $out"
    grep -q '414243' <<<"$out" && fail "the agent's refusal of '$line' echoes the value: $out"
done
big=$(head -c 4096 /dev/urandom | od -An -tx1 | tr -d ' \n') # 8192 bytes
agent "secret BIG $(printf %s "$big" | od -An -tx1 | tr -d ' \n')" 'printf %s "$BIG" | sha256sum' >/dev/null
[ "$(cut -c1-64 agentlogs/rank-0.log 2>/dev/null | tail -1)" = "$(printf %s "$big" | sha256sum | cut -c1-64)" ] ||
    fail "an 8 KiB secret did not reach the worker: $(tail -3 agentlogs/rank-0.log 2>&1)"
echo "ok: the agent refuses malformed secret lines (naming the variable only) and takes an 8 KiB one"

# --- 3. slurm without a cluster: what sbatch is given
mkdir -p fakebin
cat >fakebin/sbatch <<EOF
#!/bin/sh
# a fake sbatch: what it was given, then a refusal (no job runs)
printf '%s\n' "\$@" > "$GO/sbatch-argv"
printf %s "\$MY_TOKEN" | sha256sum | cut -c1-64 > "$GO/sbatch-hash"
echo "sbatch: error: fake sbatch of test_secrets.sh" >&2
exit 1
EOF
printf '#!/bin/sh\nexit 1\n' >fakebin/scontrol
printf '#!/bin/sh\nexit 0\n' >fakebin/scancel
chmod +x fakebin/*
cat >slurm.yaml <<EOF
workflows:
  - name: shared
    executor: slurm
    secrets: [MY_TOKEN]
    command: "true"
  - name: linked
    executor: slurm
    slurm: {work_dir: /tmp, link_host: 127.0.0.1}
    secrets: [MY_TOKEN]
    command: "true"
EOF
for wf in shared linked; do
    rm -f "$GO/sbatch-argv" "$GO/sbatch-hash"
    PATH=$PWD/fakebin:$PATH "$B" run -f slurm.yaml $wf >slurm.log 2>&1 && fail "the fake sbatch's job ran"
    grep -qF "fake sbatch of test_secrets.sh" slurm.log || fail "slurm $wf: $(cat slurm.log)"
    [ "$(cat "$GO/sbatch-hash" 2>/dev/null)" = "$WANT" ] ||
        fail "slurm $wf: sbatch's environment lacks MY_TOKEN (sha256 '$(cat "$GO/sbatch-hash" 2>/dev/null)')"
    grep -qxF -- --export=ALL "$GO/sbatch-argv" || fail "slurm $wf: no --export=ALL: $(cat "$GO/sbatch-argv")"
    grep -qaF -f "$PAT" "$GO/sbatch-argv" && fail "slurm $wf: the value is on sbatch's command line"
    S=.tandem/runs/$wf-1/job.sbatch
    grep -qF '[ -n "${MY_TOKEN+x}" ] || { echo "tandem: error: secret MY_TOKEN is not in' "$S" ||
        fail "slurm $wf: the batch script does not check MY_TOKEN: $(cat "$S")"
    echo "ok: slurm ($wf): the secret in sbatch's environment (--export=ALL), its name only in the batch script"
done
no_copy_in .tandem
grep -qaF -f "$PAT" slurm.log && fail "tandem run (slurm) printed the secret's value"

# --- 4. ssh
ssh_leg() {
    . "$SRC/tests/lib/sshd.sh"
    REMOTE=$(mktemp -d /tmp/tandem-secret-remote-XXXXXX)
    trap 'sshd_down; rm -rf "$REMOTE"' EXIT
    sshd_up 1 "$P" "$REMOTE" || fail "the ssh host did not come up"
    h1=${TSH_HOSTS[0]}
    sshd_exec ssh "$h1" "test -e '$P/.tandem'" && fail "the host sees the project"
    rm -f "$GO"/started-* "$GO/go"
    cat >ssh.yaml <<EOF
workflows:
  - name: viassh
    executor: ssh
    ssh: {hosts: [$h1], work_dir: $REMOTE}
    secrets: [MY_TOKEN]
    command: |
      mkdir -p out
      printf %s "\$MY_TOKEN" | sha256sum | cut -c1-64 > out/hash.txt
      touch "$GO/started-0"
      while [ ! -e "$GO/go" ]; do sleep 0.05; done
    artifacts: [out/hash.txt]
EOF
    sshd_exec timeout -k 5 120 "$B" run -f ssh.yaml viassh >ssh.log 2>&1 &
    local sup=$!
    for _ in $(seq 300); do
        [ -e "$GO/started-0" ] && break
        kill -0 $sup 2>/dev/null || fail "the ssh run ended before its worker started: $(cat ssh.log)"
        sleep 0.1
    done
    [ -e "$GO/started-0" ] || fail "the remote worker did not start: $(cat ssh.log)"
    no_cmdline # ssh's command line here, the agent's and the worker's there
    touch "$GO/go"
    wait $sup || fail "tandem run viassh: exit $?: $(cat ssh.log)"
    got=$(cat .tandem/runs/viassh-1/artifacts/out/hash.txt 2>/dev/null)
    [ "$got" = "$WANT" ] || fail "the remote worker saw a MY_TOKEN whose sha256 is '$got', want $WANT: $(tail -8 ssh.log)"
    sshd_host_exec 1 test -s "$REMOTE/viassh-1/work/out/hash.txt" || fail "no remote run directory"
    hits=$(sshd_host_exec 1 grep -rlaF -f "$PAT" "$REMOTE")
    [ -z "$hits" ] || fail "the remote run directory holds the value: $hits"
    no_copy_in .tandem
    grep -qaF -f "$PAT" ssh.log && fail "tandem run (ssh) printed the secret's value"
    echo "ok: ssh: the remote worker saw MY_TOKEN (sent in the agent's opening), on no command line, in no file there or here"
}
(ssh_leg)
rc=$?
case $rc in
    0) ;;
    77) echo "SKIP (ssh part only): the ssh fixture cannot run here (see above)" ;;
    *) exit $rc ;;
esac
echo "PASS"
