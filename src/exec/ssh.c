/* The ssh executor (executor: ssh): one `tandem launch` node agent per host over OpenSSH, no
 * file system shared with the hosts assumed. docs/executors.md ("The ssh executor") describes
 * what it does; the comments here say why.
 *
 * One attempt: node 0's agent first, with --rdzv-endpoint HOST:0, so that it binds a free port
 * on its own host and tells us which (a "store_port" note on its link); then the others,
 * pointed at it. Every agent runs with --forward-stdio: its stdout is a mirror stream of its
 * rank logs and metric files (tandem/mirror.h), written into RUN/logs and RUN/metrics here, and
 * its stdin is how we stop it; its stderr is the agent's own messages. An agent that fails ends
 * the attempt for all (they are told to stop, and cut off after a grace period); with
 * max_restarts the whole group starts again with TANDEM_RESUME=1, which resumes from node 0's
 * checkpoint (rank 0 reads it and broadcasts it: the other hosts need not see it). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exec/supervisor.h"
#include "tandem/loop.h"
#include "tandem/mirror.h"

#define CONNECT_TIMEOUT_S   10     /* ssh -o ConnectTimeout */
#define PREFLIGHT_TIMEOUT_S 60.0   /* log in, make the directories, check tandem */
#define COPY_TIMEOUT_S      900.0  /* the code, to each host */
#define SETUP_TIMEOUT_S     3600.0 /* a new instance's setup (it may build tandem) */
#define PORT_WAIT_S         60.0   /* node 0's agent binding its store */
#define LAUNCH_STOP_GRACE_S 30.0   /* the agents' --stop-grace */
/* After "stop", an agent has its grace period to checkpoint and exit; then we cut the
 * connection, and the agent (end of its stdin) stops on its own. */
#define CUT_AFTER_S TD__SSH_CUT_AFTER_S
_Static_assert((int)TD__SSH_CUT_AFTER_S >= (int)LAUNCH_STOP_GRACE_S + 15,
               "the agents' grace first");

/* ---- options ---- */
static char **copy_strv(char *const *v, size_t n) {
    if (!n) return NULL;
    char **c = td_xcalloc(n, sizeof *c);
    for (size_t i = 0; i < n; i++) c[i] = td_xstrdup(v[i]);
    return c;
}

static char *dup_or_null(const char *s) {
    return s ? td_xstrdup(s) : NULL;
}

void td_ssh_options_copy(td_ssh_options *dst, const td_ssh_options *src) {
    dst->hosts = copy_strv(src->hosts, src->nhosts);
    dst->nhosts = src->nhosts;
    dst->hostfile = dup_or_null(src->hostfile);
    dst->work_dir = dup_or_null(src->work_dir);
    dst->ssh_args = copy_strv(src->ssh_args, src->nssh_args);
    dst->nssh_args = src->nssh_args;
    dst->tandem = dup_or_null(src->tandem);
    dst->rdzv_host = dup_or_null(src->rdzv_host);
}

void td_ssh_options_clear(td_ssh_options *o) {
    td_ssh_hosts_free(o->hosts, o->nhosts);
    td_ssh_hosts_free(o->ssh_args, o->nssh_args);
    free(o->hostfile);
    free(o->work_dir);
    free(o->tandem);
    free(o->rdzv_host);
    memset(o, 0, sizeof *o);
}

void td_ssh_hosts_free(char **hosts, size_t count) {
    for (size_t i = 0; hosts && i < count; i++) free(hosts[i]);
    free(hosts);
}

/* [user@]host[:port], host a name, an IPv4 address or [IPv6]. The entry reaches ssh as one
 * argument, but also names the rendezvous host in a shell command: no metacharacters. */
td_status td_ssh_host_check(const char *what, const char *host) {
    if (!*host) return td_error(TD_ERR_INVALID, "%s: an empty host", what);
    for (const char *p = host; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("@._-:[]", *p))
            return td_error(TD_ERR_INVALID,
                            "%s: '%s' is not a host ([user@]host[:port]; '%c' is not allowed)",
                            what, host, *p);
    if (host[0] == '-') return td_error(TD_ERR_INVALID, "%s: '%s' starts with '-'", what, host);
    const char *at = strrchr(host, '@'), *h = at ? at + 1 : host;
    const char *colon = h[0] == '[' ? strstr(h, "]:") : strchr(h, ':');
    if (colon && h[0] == '[') colon++;
    if (!*h || h[0] == ':' ||
        (colon && (!colon[1] || strspn(colon + 1, "0123456789") != strlen(colon + 1))))
        return td_error(TD_ERR_INVALID, "%s: '%s' is not [user@]host[:port]", what, host);
    if (colon && (atoi(colon + 1) < 1 || atoi(colon + 1) > 65535))
        return td_error(TD_ERR_INVALID, "%s: '%s': the port must be 1-65535", what, host);
    return TD_OK;
}

td_status td_ssh_hosts(const td_ssh_options *o, const char *project_dir, char ***hosts,
                       size_t *count) {
    *hosts = NULL;
    *count = 0;
    if (!o->hostfile) {
        *hosts = copy_strv(o->hosts, o->nhosts);
        *count = o->nhosts;
        return TD_OK;
    }
    char *path = o->hostfile[0] == '/' || !project_dir
                     ? td_xstrdup(o->hostfile)
                     : td_xasprintf("%s/%s", project_dir, o->hostfile);
    FILE *f = fopen(path, "r");
    if (!f) {
        td_status st = td_error_errno(TD_ERR_IO, "ssh.hostfile %s", path);
        free(path);
        return st;
    }
    char line[1024];
    size_t n = 0;
    char **v = NULL;
    td_status st = TD_OK;
    for (int lineno = 1; fgets(line, sizeof line, f); lineno++) {
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char *s = line;
        while (isspace((unsigned char)*s)) s++;
        size_t len = strcspn(s, " \t\r\n");
        /* MPI and DeepSpeed hostfiles add "slots=N": the slots are nproc_per_node here. */
        const char *rest = s + len + strspn(s + len, " \t\r\n");
        if (!len) continue;
        s[len] = '\0';
        if (*rest && strncmp(rest, "slots=", 6) != 0) {
            st = td_error(TD_ERR_INVALID,
                          "%s:%d: one host per line ([user@]host[:port], optionally slots=N), "
                          "got '%s %s'",
                          path, lineno, s, rest);
            break;
        }
        char what[1100];
        snprintf(what, sizeof what, "%s:%d", path, lineno);
        if ((st = td_ssh_host_check(what, s)) != TD_OK) break;
        v = td_xrealloc(v, (n + 1) * sizeof *v);
        v[n++] = td_xstrdup(s);
    }
    fclose(f);
    if (st == TD_OK && !n) st = td_error(TD_ERR_INVALID, "ssh.hostfile %s names no host", path);
    free(path);
    if (st != TD_OK) {
        td_ssh_hosts_free(v, n);
        return st;
    }
    *hosts = v;
    *count = n;
    return TD_OK;
}

/* ---- the supervisor ---- */
typedef struct ssh_sup ssh_sup;

typedef struct {
    char *entry;  /* as written: user@host:port */
    char *dest;   /* what ssh connects to: user@host */
    char *port;   /* -p, or NULL */
    char *addr;   /* host: how the other hosts reach this one (node 0's store) */
    char *remote; /* the run's directory there, absolute (the run directory itself if shared) */
    char *work;   /* remote/work: the commands' working directory there */
    int shared;   /* it sees this machine's run directory at the same path */
} host;

typedef struct {
    ssh_sup *c;
    int node;
    pid_t pid; /* the local ssh; 0 once reaped */
    int in_fd, out_fd, err_fd;
    int status; /* wait status once reaped */
    td_mirror_in *mirror;
    int mirror_bad; /* its stream broke the protocol: ignored from there on */
    td__buf errline;
    int stop_sent;
} agent;

struct ssh_sup {
    const td_exec_job *job;
    host *hosts;
    size_t nhosts;
    char *ssh;      /* absolute */
    char token[33]; /* the run's RUN/token */
    int store_port; /* node 0's, from its link; 0 before */
    td__echo echo;
    td__ssh_note_fn note_hook; /* the other notes of the agents (td__ssh_on_note) */
    void *note_user;
};

/* A progress line ("tandem: ...") and how a run fails before its job ran: exec.c's. */
#define say(c, ...)          td__exec_say((c)->job->out, __VA_ARGS__)
#define fail_run(c, t0, ...) td__exec_fail((c)->job, (t0), __VA_ARGS__)
#define write_all            td__exec_write_all

static void split_host(const char *entry, host *h) {
    h->entry = td_xstrdup(entry);
    const char *at = strrchr(entry, '@');
    const char *hp = at ? at + 1 : entry;
    const char *colon = hp[0] == '[' ? strstr(hp, "]:") : strchr(hp, ':');
    if (colon && hp[0] == '[') colon++;
    size_t hlen = colon ? (size_t)(colon - hp) : strlen(hp);
    h->port = colon ? td_xstrdup(colon + 1) : NULL;
    h->dest = td_xasprintf("%.*s", (int)(hp - entry + hlen), entry);
    if (hp[0] == '[') /* [v6] -> v6 for ssh and the endpoint's own brackets */
        h->addr = td_xasprintf("%.*s", (int)(hlen - 2), hp + 1);
    else
        h->addr = td_xasprintf("%.*s", (int)hlen, hp);
    if (hp[0] == '[') {
        free(h->dest);
        h->dest = td_xasprintf("%.*s%s", (int)(hp - entry), entry, h->addr);
    }
}

/* ssh [options] DEST COMMAND: batch mode (keys or an agent, never a password prompt), no tty,
 * keepalives so that a dead host is noticed in about 15 s even when the agent is silent. */
static char **ssh_argv(const ssh_sup *c, const host *h, const char *command) {
    const td_ssh_options *o = c->job->ssh;
    size_t n = 0, cap = 16 + o->nssh_args;
    char **v = td_xcalloc(cap, sizeof *v);
    v[n++] = td_xstrdup(c->ssh);
    v[n++] = td_xstrdup("-T");
    v[n++] = td_xstrdup("-o");
    v[n++] = td_xstrdup("BatchMode=yes");
    v[n++] = td_xstrdup("-o");
    v[n++] = td_xasprintf("ConnectTimeout=%d", CONNECT_TIMEOUT_S);
    v[n++] = td_xstrdup("-o");
    v[n++] = td_xstrdup("ServerAliveInterval=5");
    v[n++] = td_xstrdup("-o");
    v[n++] = td_xstrdup("ServerAliveCountMax=3");
    if (h->port) {
        v[n++] = td_xstrdup("-p");
        v[n++] = td_xstrdup(h->port);
    }
    for (size_t i = 0; i < o->nssh_args; i++) v[n++] = td_xstrdup(o->ssh_args[i]);
    v[n++] = td_xstrdup("--");
    v[n++] = td_xstrdup(h->dest);
    v[n++] = td_xstrdup(command);
    return v;
}

static void argv_free(char **v) {
    for (char **p = v; p && *p; p++) free(*p);
    free(v);
}

/* The remote command: a POSIX sh script whatever the login shell is (bash, zsh, dash). */
static char *remote_sh(const char *script) {
    td__buf b = {0};
    td__buf_add(&b, "/bin/sh -c ", 11);
    td__buf_quote(&b, script);
    return b.s;
}

static const char *tandem_on_hosts(const ssh_sup *c) {
    return c->job->ssh->tandem ? c->job->ssh->tandem : c->job->tandem_bin;
}

/* Logs in to each host in turn: makes the run's directory there (or finds that the host
 * sees ours: a shared file system), and checks that tandem runs. The first failure names the
 * host and what ssh or the host said. */
/* The end of a remote script: tandem must run there (after a setup, which may have put it). */
static void add_tandem_check(const ssh_sup *c, td__buf *s) {
    td__buf_addf(s, "command -v ");
    td__buf_quote(s, tandem_on_hosts(c));
    td__buf_addf(s, " >/dev/null || { echo \"tandem: no ");
    td__buf_add(s, tandem_on_hosts(c), strlen(tandem_on_hosts(c)));
    td__buf_addf(s, " on $(hostname)\" >&2; exit 4; }\n");
}

/* check_tandem: also that tandem runs there (not yet where a setup will install it). A host that
 * did not answer (ssh's own failure, 255, or no answer in time) is TD_ERR_PEER; one that answered
 * and failed, TD_ERR_IO. */
static td_status preflight(ssh_sup *c, size_t first, size_t end, bool check_tandem, char *why,
                           size_t nbytes) {
    const td_run *run = c->job->run;
    char marker_name[40], marker_hex[17];
    TD_CHECK(td_random_hex(marker_hex, 8));
    snprintf(marker_name, sizeof marker_name, "ssh-probe-%s", marker_hex);
    char *marker = td_xasprintf("%s/%s", run->run_dir, marker_name);
    td_chunk chunk = {"", 0};
    TD_CHECK(td_write_atomic(marker, "ssh probe file", &chunk, 1));
    char *base =
        c->job->ssh->work_dir ? td_xstrdup(c->job->ssh->work_dir) : td_xstrdup(".tandem-runs");
    td__buf s = {0};
    td__buf_add(&s, "if [ -e ", 8);
    td__buf_quote(&s, marker);
    td__buf_add(&s, " ]; then R=", 11);
    td__buf_quote(&s, run->run_dir);
    td__buf_addf(&s, "; echo shared; else R=");
    td__buf_quote(&s, base);
    td__buf_addf(&s, "/");
    td__buf_quote(&s, run->id);
    td__buf_addf(&s, "; echo separate; fi\n"
                     "mkdir -p \"$R/work\" \"$R/agent/logs\" \"$R/agent/metrics\" "
                     "\"$R/checkpoints\" && cd \"$R\" && pwd || exit 3\n");
    if (check_tandem) add_tandem_check(c, &s);
    char *cmd = remote_sh(s.s);
    free(s.s);

    /* One host after another: a few hundred ms each. (Dozens of hosts would want these in
     * parallel, and the code copies too; docs/executors.md lists it.) */
    td_status st = TD_OK;
    for (size_t i = first; i < end && st == TD_OK; i++) {
        host *h = &c->hosts[i];
        char **argv = ssh_argv(c, h, cmd);
        char *out = NULL, *err = NULL;
        int code = 0;
        st = td__exec_capture(argv, NULL, PREFLIGHT_TIMEOUT_S, &out, &err, &code);
        argv_free(argv);
        if (st == TD_OK && code != 0) {
            char msg[600];
            td__exec_joined_lines(err && *err ? err : out, msg, sizeof msg);
            snprintf(why, nbytes, "ssh host %s (node %zu): %s (exit code %d)%s", h->entry, i,
                     msg[0] ? msg : "no message", code,
                     code == 255   ? "; check that `ssh -o BatchMode=yes HOST true` works from "
                                     "here: key-based login (ssh-copy-id), known_hosts, the address"
                     : code == 124 ? "; it did not answer within 60 s"
                                   : "");
            st = code == 255 || code == 124 ? TD_ERR_PEER : TD_ERR_IO;
        } else if (st == TD_OK) {
            char *nl = strchr(out, '\n');
            char *path = nl ? nl + 1 : NULL;
            if (path) path[strcspn(path, "\n")] = '\0';
            if (!path || path[0] != '/') {
                snprintf(why, nbytes, "ssh host %s: unexpected answer to the set-up: '%.200s'",
                         h->entry, out);
                st = TD_ERR_IO;
            } else {
                h->shared = !strncmp(out, "shared", 6);
                h->remote = td_xstrdup(path);
                h->work = td_run_path(path, TD_RUN_PATH_WORK);
            }
        } else {
            snprintf(why, nbytes, "ssh host %s: %s", h->entry, td_error_msg());
            td_error_clear();
            st = TD_ERR_IO;
        }
        free(out);
        free(err);
    }
    unlink(marker);
    free(marker);
    free(cmd);
    free(base);
    return st;
}

static void host_clear(host *h);

/* The count of one host: its tandem launch starts the workers of spec (tandem launch's own rule,
 * where the workers run), each a /bin/sh that exits at once; local rank 0 prints
 * LOCAL_WORLD_SIZE, a number set in its environment (not a message parsed). */
td_status td_ssh_count_nproc(const td_ssh_options *o, const char *project_dir,
                             const char *tandem_bin, const char *spec, const char *cuda_visible,
                             int *out, char *note, size_t nbytes) {
    *out = 0;
    if (nbytes) note[0] = '\0';
    td_exec_job job = {.ssh = o, .tandem_bin = tandem_bin};
    ssh_sup c = {.job = &job};
    char **list = NULL;
    size_t nlist = 0;
    TD_CHECK(td_ssh_hosts(o, project_dir, &list, &nlist));
    c.ssh = td__exec_which("ssh");
    if (!c.ssh) {
        td_ssh_hosts_free(list, nlist);
        return td_error(TD_ERR_USAGE, "executor ssh: ssh is not on PATH; install OpenSSH's "
                                      "client (Debian: openssh-client)");
    }
    td__buf s = {0};
    if (cuda_visible) {
        td__buf_addf(&s, "CUDA_VISIBLE_DEVICES=");
        td__buf_quote(&s, cuda_visible);
        td__buf_addf(&s, "; export CUDA_VISIBLE_DEVICES\n");
    }
    add_tandem_check(&c, &s);
    td__buf_quote(&s, tandem_on_hosts(&c));
    td__buf_addf(&s, " launch --standalone --nproc-per-node ");
    td__buf_quote(&s, spec);
    td__buf_addf(&s, " -- /bin/sh -c 'test \"$LOCAL_RANK\" != 0 || echo \"tandem-nproc "
                     "$LOCAL_WORLD_SIZE\"'\n");
    char *cmd = remote_sh(s.s);
    free(s.s);
    td_status st = TD_OK;
    const char *first = NULL;
    for (size_t i = 0; i < nlist && st == TD_OK; i++) {
        host h = {0};
        split_host(list[i], &h);
        char **argv = ssh_argv(&c, &h, cmd);
        char *o_text = NULL, *e_text = NULL;
        int code = 0, n = 0;
        st = td__exec_capture(argv, NULL, PREFLIGHT_TIMEOUT_S, &o_text, &e_text, &code);
        argv_free(argv);
        const char *at = st == TD_OK ? strstr(o_text, "tandem-nproc ") : NULL;
        char msg[600];
        if (st != TD_OK) {
            snprintf(msg, sizeof msg, "%s", td_error_msg());
            td_error_clear();
            st = td_error(TD_ERR_IO, "nproc_per_node: %s: counting on ssh host %s: %s", spec,
                          h.entry, msg);
        } else if (code != 0 || !at || sscanf(at + 13, "%d", &n) != 1 || n < 1) {
            td__exec_joined_lines(e_text && *e_text ? e_text : o_text, msg, sizeof msg);
            st = td_error(code == 255 || code == 124 ? TD_ERR_PEER : TD_ERR_IO,
                          "nproc_per_node: %s: ssh host %s could not count its workers (exit "
                          "code %d): %s",
                          spec, h.entry, code, msg[0] ? msg : "no message");
        } else if (*out && n != *out) {
            st = td_error(TD_ERR_USAGE,
                          "nproc_per_node: %s counts %d workers on ssh host %s but %d on %s; a "
                          "run has one count per node: give a number",
                          spec, *out, first, n, h.entry);
        } else if (!*out) {
            *out = n;
            first = list[i];
            td__exec_joined_lines(e_text, msg, sizeof msg);
            if (nbytes) snprintf(note, nbytes, "ssh host %s: %s", h.entry, msg);
        }
        free(o_text);
        free(e_text);
        host_clear(&h);
    }
    if (st != TD_OK) *out = 0;
    free(cmd);
    free(c.ssh);
    td_ssh_hosts_free(list, nlist);
    return st;
}

/* Runs `[local |] ssh HOST 'remote' [| after]` through /bin/sh, a tar stream between this
 * machine and the host: *code gets the pipeline's exit code, msg (nbytes) what it said. */
static td_status ssh_pipe(const ssh_sup *c, const host *h, const char *local, const char *remote,
                          const char *after, int *code, char *msg, size_t nbytes) {
    char *rcmd = remote_sh(remote);
    char **sargv = ssh_argv(c, h, rcmd);
    free(rcmd);
    td__buf l = {0};
    if (local) td__buf_addf(&l, "%s | ", local);
    for (char **a = sargv; *a; a++) {
        td__buf_quote(&l, *a);
        td__buf_add(&l, " ", 1);
    }
    argv_free(sargv);
    if (after) td__buf_addf(&l, "| %s", after);
    char *argv[] = {"/bin/sh", "-c", l.s, NULL};
    char *out = NULL, *err = NULL;
    td_status st = td__exec_capture(argv, NULL, COPY_TIMEOUT_S, &out, &err, code);
    td__exec_joined_lines(st != TD_OK ? td_error_msg() : err, msg, nbytes);
    td_error_clear();
    free(l.s);
    free(out);
    free(err);
    return st;
}

/* The code, to each host that does not share our file system: the files of the project as
 * RUN/work shows them (its entries are the project's, linked), which for a git work tree are
 * the files git sees (tracked, and untracked but not ignored: what the recorded code version
 * and the user's uncommitted work are made of), else every file but .git and .tandem. The
 * outputs the workflow declares are empty in RUN/work, so they are not copied. */
static td_status copy_code(ssh_sup *c, size_t first, size_t end, char *why, size_t nbytes) {
    const td_exec_job *job = c->job;
    /* the file list and the tar stream, the same for every host */
    td__buf l = {.s = td__exec_code_tar_script(job)};
    td_status st = TD_OK;
    for (size_t i = first; i < end && st == TD_OK; i++) {
        host *h = &c->hosts[i];
        if (h->shared) continue;
        td__buf rs = {0};
        td__buf_addf(&rs, "mkdir -p ");
        td__buf_quote(&rs, h->work);
        td__buf_addf(&rs, " && tar -xf - -C ");
        td__buf_quote(&rs, h->work);
        int code = 0;
        char msg[600];
        st = ssh_pipe(c, h, l.s, rs.s, NULL, &code, msg, sizeof msg);
        free(rs.s);
        if (st != TD_OK || code != 0) {
            snprintf(why, nbytes, "copying the code to ssh host %s (%s) failed (exit code %d): %s",
                     h->entry, h->work, code, msg[0] ? msg : "no message");
            st = TD_ERR_IO;
        }
    }
    free(l.s);
    return st;
}

/* The job's PATH is this tandem's directory, then the workflow's env: PATH with our own PATH
 * where it said $PATH (src/workflow/run.c). On a host: the workflow's part with the host's
 * "$PATH" in place of ours; nothing when it is ours alone. The host's tandem goes first later. */
static void add_path(const ssh_sup *c, td__buf *b, const char *val, const char *old) {
    const char *slash = strrchr(c->job->tandem_bin, '/');
    size_t dlen = slash ? (size_t)(slash - c->job->tandem_bin) : 0;
    if (slash && !strncmp(val, c->job->tandem_bin, dlen) && val[dlen] == ':') val += dlen + 1;
    if (old && !strcmp(val, old)) return;
    const char *at = old && *old ? strstr(val, old) : NULL;
    char *before = td_xasprintf("%.*s", (int)(at ? at - val : (ptrdiff_t)strlen(val)), val);
    td__buf_addf(b, "export PATH=");
    td__buf_quote(b, before);
    if (at) {
        td__buf_addf(b, "\"$PATH\"");
        td__buf_quote(b, at + strlen(old));
    }
    td__buf_add(b, "\n", 1);
    free(before);
}

/* What the workers' environment adds to ours (the run's variables, the workflow's env,
 * TANDEM_RESUME), with this machine's run directory replaced by the host's: the host's own
 * login environment is the rest, as for a worker that torchrun starts there. PATH puts the
 * hosts' tandem first. The token goes over the link, never on a command line. */
static void add_env(const ssh_sup *c, const host *h, td__buf *b, int resume) {
    const char *run_dir = c->job->run->run_dir;
    size_t rlen = strlen(run_dir);
    const char *tok = td_var_name(TD_VAR_TANDEM_TOKEN);
    const char *resume_name = td_var_name(TD_VAR_TANDEM_RESUME);
    const char *project = td_var_name(TD_VAR_TANDEM_PROJECT_DIR);
    /* What decides the bits travels too: a login environment's OpenBLAS kernel choice (and
     * TANDEM_ISA, tandem's own) reaches the hosts (an ssh session starts without it), so the
     * nodes compute what this machine would (tandem launch then pins node 0's core and the
     * lowest level on every node). Before the job's own variables, which win where they set
     * these. */
    td__buf_export_numerics(b);
    for (char *const *e = c->job->env; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq) continue;
        size_t klen = (size_t)(eq - *e);
        char *key = td_xasprintf("%.*s", (int)klen, *e);
        const char *old = getenv(key), *val = eq + 1;
        /* a secret goes in the opening, never on ssh's command line (exec.h) */
        if (!strcmp(key, "PATH")) { /* a workflow's env: PATH (issue 30), as the host has it */
            add_path(c, b, val, old);
            free(key);
            continue;
        }
        /* ours is not the host's: a value equal to ours is left out (the host's login
         * environment has its own) unless the workflow's env: names it */
        bool named = false;
        for (char *const *n = c->job->env_named; n && *n && !named; n++) named = !strcmp(*n, key);
        int skip = !strcmp(key, tok) || !strcmp(key, resume_name) ||
                   (old && !strcmp(old, val) && !named) ||
                   td_exec_secret_value(c->job->secrets, key);
        for (const char *p = key; *p && !skip; p++)
            if (!isalnum((unsigned char)*p) && *p != '_') skip = 1;
        if (!skip) {
            char *v;
            if (!strcmp(key, project))
                v = td_xstrdup(h->work);
            else if (!h->shared && !strncmp(val, run_dir, rlen) && (val[rlen] == '/' || !val[rlen]))
                v = td_xasprintf("%s%s", h->remote, val + rlen);
            else
                v = td_xstrdup(val);
            td__buf_addf(b, "export %s=", key);
            td__buf_quote(b, v);
            td__buf_add(b, "\n", 1);
            free(v);
        }
        free(key);
    }
    if (resume) td__buf_addf(b, "export %s=1\n", resume_name);
    /* The agent samples its workers' CPU, memory and GPU (we cannot see the host's /proc). */
    td__buf_addf(b, "export %s=%.3f\n", td_var_name(TD_VAR_TANDEM_SYS_METRICS),
                 c->job->run->created_s);
    char *dir = td_xstrdup(tandem_on_hosts(c));
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        td__buf_addf(b, "export PATH=");
        td__buf_quote(b, dir[0] ? dir : "/");
        td__buf_addf(b, ":\"$PATH\"\n");
    }
    free(dir);
}

/* ---- what comes back ---- */
static void on_note(void *user, const char *key, const char *value) {
    agent *a = user;
    ssh_sup *c = a->c;
    if (!strcmp(key, "store_port"))
        c->store_port = atoi(value);
    else if (c->note_hook)
        c->note_hook(c->note_user, a->node, key, value);
}

/* A whole file arrived: the script's sdk.json goes into place. */
static void on_file(void *user, const char *name, int64_t size) {
    (void)size;
    td__exec_record_arrived(((agent *)user)->c->job->run, name);
}

/* Rank log bytes, to our stdout as the local launcher prints them ("[rank R] line"). */
static void on_data(void *user, const char *name, const char *bytes, size_t n) {
    ssh_sup *c = ((agent *)user)->c;
    if (!c->job->quiet_output) td__exec_echo_rank_log(&c->echo, name, bytes, n);
}

/* Starts node `node`'s agent: ssh ... 'cd R/work && exec tandem launch --forward-stdio ...',
 * then the opening lines on its stdin (token, secrets, what our copies hold, go). */
static td_status start_agent(ssh_sup *c, int node, int resume, agent *a) {
    const td_exec_job *job = c->job;
    const host *h = &c->hosts[node];
    memset(a, 0, sizeof *a);
    a->c = c;
    a->node = node;
    a->in_fd = a->out_fd = a->err_fd = -1;
    td__buf s = {0};
    add_env(c, h, &s, resume);
    td__buf_addf(&s, "cd ");
    td__buf_quote(&s, h->work);
    td__buf_addf(&s, " || exit 1\nexec ");
    td__buf_quote(&s, tandem_on_hosts(c));
    const host *h0 = &c->hosts[0];
    const char *rdzv = job->ssh->rdzv_host ? job->ssh->rdzv_host : h0->addr;
    int v6 = strchr(rdzv, ':') != NULL;
    td__buf_addf(&s,
                 " launch --forward-stdio --nnodes %zu --node-rank %d --nproc-per-node %d "
                 "--rdzv-endpoint %s%s%s:%d --max-restarts 0 --stop-grace %.0f --rdzv-id ",
                 c->nhosts, node, job->run->nproc_per_node, v6 ? "[" : "", rdzv, v6 ? "]" : "",
                 node == 0 ? 0 : c->store_port, LAUNCH_STOP_GRACE_S);
    td__buf_quote(&s, job->run->id);
    char *logs = td_xasprintf("%s/agent/logs", h->remote);
    char *metrics = td_xasprintf("%s/agent/metrics", h->remote);
    for (size_t i = 0; i < job->nnode_setup; i++) {
        td__buf_addf(&s, " --node-setup ");
        td__buf_quote(&s, job->node_setup[i]);
    }
    td__buf_addf(&s, " --log-dir ");
    td__buf_quote(&s, logs);
    td__buf_addf(&s, " --metrics-dir ");
    td__buf_quote(&s, metrics);
    free(logs);
    free(metrics);
    td__buf_addf(&s, " -- /bin/sh -c ");
    /* As the local executor: the shell waits for the program on SIGTERM (its checkpoint). */
    char *script = td_xasprintf("trap : TERM\n%s", job->script);
    td__buf_quote(&s, script);
    free(script);
    char *cmd = remote_sh(s.s);
    free(s.s);
    char **argv = ssh_argv(c, h, cmd);
    free(cmd);

    int pi[2] = {-1, -1}, po[2] = {-1, -1}, pe[2] = {-1, -1};
    td_status st = TD_OK;
    if (pipe2(pi, O_CLOEXEC) || pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC)) {
        st = td_error_errno(TD_ERR_SYS, "pipes for ssh to %s", h->entry);
    } else {
        td_spawn_opts so;
        td_spawn_opts_init(&so);
        so.argv = argv;
        so.in_fd = pi[0];
        so.out_fd = po[1];
        so.err_fd = pe[1];
        so.new_group = true;       /* a Ctrl-C at the terminal is ours to handle, not ssh's */
        so.death_signal = SIGTERM; /* we die: ssh goes, the agent sees its stdin end, stops */
        st = td_spawn(&so, &a->pid);
    }
    argv_free(argv);
    if (pi[0] >= 0) close(pi[0]);
    if (po[1] >= 0) close(po[1]);
    if (pe[1] >= 0) close(pe[1]);
    a->in_fd = pi[1];
    a->out_fd = po[0];
    a->err_fd = pe[0];
    if (st != TD_OK) return st;
    /* end/: the agent's end record, sent whole as its link closes; sdk-inbox/, artifacts/:
     * the script's record, from node 0 (rank 0's) when its host does not share our run
     * directory */
    const char *const prefixes[] = {td_run_path_name(TD_RUN_PATH_LOGS),
                                    td_run_path_name(TD_RUN_PATH_METRICS),
                                    td_run_path_name(TD_RUN_PATH_END), TD__EXEC_RECORD_PREFIXES};
    bool record = node == 0 && !h->shared;
    td_mirror_callbacks cb = {.note = on_note, .data = on_data, .file = on_file, .user = a};
    a->mirror = td_mirror_in_new(job->run->run_dir, prefixes,
                                 TD_ARRAY_LEN(prefixes) - (record ? 0 : 2), &cb);
    char *manifest = td_mirror_in_manifest(a->mirror);
    char *secrets = td__exec_secret_lines(job->secrets);
    char *opening = td_xasprintf("token %s\n%s%s%sgo\n", c->token, secrets, manifest,
                                 record ? "record\n" : "");
    write_all(a->in_fd, opening, strlen(opening));
    free(manifest);
    td__exec_wipe_free(secrets);
    td__exec_wipe_free(opening);
    fcntl(a->out_fd, F_SETFL, O_NONBLOCK);
    fcntl(a->err_fd, F_SETFL, O_NONBLOCK);
    return TD_OK;
}

/* The agent's stdout: its link. Returns 0 at end of file. */
static int pump_out(ssh_sup *c, agent *a) {
    char buf[65536];
    for (;;) {
        ssize_t n = read(a->out_fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return 1; /* EAGAIN */
        if (n == 0) return 0;
        if (a->mirror_bad) continue;
        td_status st = td_mirror_in_feed(a->mirror, buf, (size_t)n);
        if (st != TD_OK) {
            TD_LOG_WARN("ssh host %s: its agent's link: %s; its logs and metrics are ignored "
                        "from here on",
                        c->hosts[a->node].entry, td_error_msg());
            td_error_clear();
            a->mirror_bad = 1;
        }
    }
}

/* The agent's stderr: its own messages, to ours with the host in front. Nothing is parsed from
 * it: how the agent ended comes in its end record (endrec.h, RUN/end/node-N.json). */
static void err_line(ssh_sup *c, agent *a, const char *text) {
    char line[4200];
    int len = snprintf(line, sizeof line, "[%s] %s\n", c->hosts[a->node].entry, text);
    write_all(STDERR_FILENO, line, (size_t)TD_MIN(len, (int)sizeof line - 1));
}

static int pump_err(ssh_sup *c, agent *a, int final) {
    char buf[8192];
    int open_ = 1;
    for (;;) {
        ssize_t n = read(a->err_fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            open_ = n < 0;
            break;
        }
        td__buf_add(&a->errline, buf, (size_t)n);
    }
    size_t at = 0;
    for (char *nl; a->errline.s && (nl = memchr(a->errline.s + at, '\n', a->errline.len - at));) {
        *nl = '\0';
        err_line(c, a, a->errline.s + at);
        at = (size_t)(nl - a->errline.s) + 1;
    }
    if (a->errline.s) {
        memmove(a->errline.s, a->errline.s + at, a->errline.len - at);
        a->errline.len -= at;
        a->errline.s[a->errline.len] = '\0';
        if ((final || !open_) && a->errline.len) {
            err_line(c, a, a->errline.s);
            a->errline.len = 0;
        }
    }
    return open_;
}

/* ---- the carrier: one attempt's agents, on the supervisor's event loop ----
 * Watched: each agent's stdout (its mirror stream) and stderr, and its ssh client's exit; one
 * timer for node 0's store port, one for the hard stop's SIGKILL. The supervisor (supervisor.h)
 * decides; this says what happened: every node running (node 0's store is up and the others
 * started), a node lost (its agent failed: the others must not train on without it), the
 * attempt over (every agent gone, every byte of its link read). */
typedef struct {
    td__carrier base;
    ssh_sup *c;
    td__sup *sup;
    agent *agents;
    int n, started;
    bool resume, stopping, running, over;
    int failed;      /* the first node whose agent failed, -1: none */
    int failed_code; /* its exit code (255, ssh's own failure, as 1) */
    char why[1024];  /* what failed, in words */
    uint64_t port_timer, kill_timer;
} ssh_carrier;

static void send_stop(agent *a) {
    if (a->stop_sent || a->in_fd < 0) return;
    write_all(a->in_fd, "stop\n", 5);
    a->stop_sent = 1;
}

/* Ends our side of the connection: the agent reads the end of its stdin and stops by itself,
 * whatever became of the network. */
static void cut(agent *a) {
    if (a->in_fd >= 0) close(a->in_fd);
    a->in_fd = -1;
    a->stop_sent = 1;
    if (a->pid > 0) kill(a->pid, SIGTERM);
}

static void agent_free(td_loop *l, agent *a) {
    if (a->in_fd >= 0) close(a->in_fd);
    if (a->out_fd >= 0) {
        td_loop_unwatch(l, a->out_fd);
        close(a->out_fd);
    }
    if (a->err_fd >= 0) {
        td_loop_unwatch(l, a->err_fd);
        close(a->err_fd);
    }
    if (a->pid > 0) {
        kill(a->pid, SIGKILL);
        td_waitpid(a->pid, NULL, 0);
    }
    td_mirror_in_free(a->mirror);
    free(a->errline.s);
    memset(a, 0, sizeof *a);
    a->in_fd = a->out_fd = a->err_fd = -1;
}

/* Every agent gone: how the attempt ended, with the failing node's own account from its end
 * record (every byte of its link has been read by now). */
static void attempt_over(ssh_carrier *sc) {
    ssh_sup *c = sc->c;
    td__sup_exit e = {.code = 0, .worker_code = -1};
    int *codes = td_xcalloc((size_t)sc->n, sizeof *codes);
    bool checkpointed = sc->started == sc->n, fail = false;
    for (int i = 0; i < sc->n; i++) {
        int code = i < sc->started ? td_wait_exit_code(sc->agents[i].status) : -1;
        codes[i] = code;
        if (code != 0 && code != 143) checkpointed = false;
        if (code == 143 && !e.code) e.code = 143;
        if (code != 0 && sc->failed < 0 && !sc->stopping && !fail) {
            fail = true;
            e.code = code == 255 ? 1 : code;
            snprintf(sc->why, sizeof sc->why, "node %d (ssh host %s): its agent failed", i,
                     c->hosts[i].entry);
        }
    }
    if (sc->failed >= 0)
        e.code = sc->failed_code;
    else if (sc->stopping)
        e.code = sc->started == 0 ? -1 : checkpointed ? 143 : 1;
    td_exec_end_summary sum;
    td_exec_end_records_read(c->job->run, sc->n, codes, &sum);
    free(codes);
    if (sum.worker_code >= 0 && (sc->failed >= 0 || fail)) {
        e.worker_code = sum.worker_code;
        snprintf(e.cause, sizeof e.cause, "%s", sum.cause);
    } else if (fail) {
        snprintf(e.cause, sizeof e.cause, "%s", sc->why);
    }
    e.node_restarts = sum.restarts;
    td_loop *l = td__sup_loop(sc->sup);
    td_loop_cancel(l, sc->port_timer);
    td_loop_cancel(l, sc->kill_timer);
    sc->port_timer = sc->kill_timer = 0;
    for (int i = 0; i < sc->n; i++) agent_free(l, &sc->agents[i]);
    sc->over = true;
    td__sup_attempt_over(sc->sup, &e);
}

static void check_over(ssh_carrier *sc) {
    if (sc->over) return;
    for (int i = 0; i < sc->started; i++) {
        agent *a = &sc->agents[i];
        if (a->pid > 0 || a->out_fd >= 0 || a->err_fd >= 0) return;
    }
    if (sc->stopping || sc->failed >= 0 || sc->started == sc->n) attempt_over(sc);
}

/* A node lost: the first failure is the attempt's; the others hear of it ("lost N": their
 * workers must not wait for it in a collective) and the supervisor stops them. */
static void node_failed(ssh_carrier *sc, int node, int code, const char *fmt, ...) TD_PRINTF(4, 5);
static void node_failed(ssh_carrier *sc, int node, int code, const char *fmt, ...) {
    if (sc->failed >= 0 || sc->stopping) return;
    sc->failed = node;
    sc->failed_code = code == 255 ? 1 : code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sc->why, sizeof sc->why, fmt, ap);
    va_end(ap);
    char lost[32];
    int len = snprintf(lost, sizeof lost, "lost %d\n", node);
    for (int k = 0; k < sc->started; k++)
        if (sc->agents[k].in_fd >= 0) write_all(sc->agents[k].in_fd, lost, (size_t)len);
    td__sup_node_lost(sc->sup, node, sc->why);
}

static td_status start_one(ssh_carrier *sc, int i);

/* node 0's store is up: the others, pointed at it */
static void start_others(ssh_carrier *sc) {
    ssh_sup *c = sc->c;
    for (int i = 1; i < sc->n && !sc->stopping; i++)
        if (start_one(sc, i) != TD_OK) {
            char err[512];
            snprintf(err, sizeof err, "%s", td_error_msg());
            td_error_clear();
            node_failed(sc, i, 1, "cannot start ssh to %s: %s", c->hosts[i].entry, err);
            return;
        }
    if (sc->stopping) return;
    td__sup_say(sc->sup, "run %s: %d agents started (store on %s:%d)", c->job->run->id, sc->started,
                c->job->ssh->rdzv_host ? c->job->ssh->rdzv_host : c->hosts[0].addr, c->store_port);
}

/* After node 0's link spoke: its store port starts the others; every node started is running. */
static void after_link(ssh_carrier *sc) {
    if (sc->stopping || sc->running || sc->c->store_port <= 0) return;
    td_loop_cancel(td__sup_loop(sc->sup), sc->port_timer);
    sc->port_timer = 0;
    if (sc->started == 1 && sc->n > 1) start_others(sc);
    if (sc->started == sc->n && !sc->stopping) {
        sc->running = true;
        td__sup_running_now(sc->sup);
    }
}

static void on_agent_fd(td_loop *l, int fd, unsigned events, void *user) {
    (void)events;
    ssh_carrier *sc = user;
    for (int i = 0; i < sc->started; i++) {
        agent *a = &sc->agents[i];
        if (a->out_fd == fd && !pump_out(sc->c, a)) {
            td_loop_unwatch(l, fd);
            close(a->out_fd);
            a->out_fd = -1;
        } else if (a->err_fd == fd && !pump_err(sc->c, a, 0)) {
            td_loop_unwatch(l, fd);
            close(a->err_fd);
            a->err_fd = -1;
        }
    }
    after_link(sc);
    check_over(sc);
}

/* An agent's ssh ended. One that fails without being asked to stop ends the attempt. */
static void on_agent_exit(td_loop *l, pid_t pid, int status, void *user) {
    (void)l;
    ssh_carrier *sc = user;
    for (int i = 0; i < sc->started; i++) {
        agent *a = &sc->agents[i];
        if (a->pid != pid) continue;
        a->pid = 0;
        a->status = status;
        if (a->in_fd >= 0) close(a->in_fd);
        a->in_fd = -1;
        int code = td_wait_exit_code(status);
        if (code != 0 && !a->stop_sent) {
            char desc[160];
            td_wait_describe(status, desc, sizeof desc);
            pump_err(sc->c, a, 1);
            /* what its end record says replaces this once it has arrived */
            node_failed(sc, i, code, "node %d (ssh host %s): %s", i, sc->c->hosts[i].entry,
                        code == 255 ? "its agent or its ssh connection ended (ssh exit code 255)"
                                    : desc);
        }
    }
    check_over(sc);
}

static void on_port_timeout(td_loop *l, void *user) {
    (void)l;
    ssh_carrier *sc = user;
    sc->port_timer = 0;
    if (sc->c->store_port > 0 || sc->stopping) return;
    cut(&sc->agents[0]);
    node_failed(sc, 0, 1, "node 0's agent on %s did not report its rendezvous store within %.0f s",
                sc->c->hosts[0].entry, PORT_WAIT_S);
}

static td_status start_one(ssh_carrier *sc, int i) {
    td_loop *l = td__sup_loop(sc->sup);
    TD_CHECK(start_agent(sc->c, i, sc->resume, &sc->agents[i]));
    sc->started = i + 1;
    agent *a = &sc->agents[i];
    td_status st = td_loop_watch(l, a->out_fd, TD_LOOP_READ, on_agent_fd, sc);
    if (st == TD_OK) st = td_loop_watch(l, a->err_fd, TD_LOOP_READ, on_agent_fd, sc);
    if (st == TD_OK) st = td_loop_watch_child(l, a->pid, on_agent_exit, sc);
    if (st != TD_OK) cut(a); /* not watched: not left running either */
    return st;
}

/* Node 0's agent first (it binds its store on a free port and says which); the others once it
 * has. */
static td_status ssh_start(td__carrier *base, td__sup *sup, bool resume) {
    ssh_carrier *sc = (ssh_carrier *)base;
    td_loop *l = td__sup_loop(sup);
    sc->sup = sup;
    sc->resume = resume;
    sc->started = 0;
    sc->stopping = sc->running = sc->over = false;
    sc->failed = -1;
    sc->why[0] = '\0';
    sc->c->store_port = 0;
    for (int i = 0; i < sc->n; i++) agent_free(l, &sc->agents[i]);
    if (td_exec_end_records_reset(sc->c->job->run, sc->n) != TD_OK) { /* causes: vaguer */
        TD_LOG_WARN("%s", td_error_msg());
        td_error_clear();
    }
    td_status st = start_one(sc, 0);
    if (st != TD_OK) {
        char err[512];
        snprintf(err, sizeof err, "%s", td_error_msg());
        agent_free(l, &sc->agents[0]);
        sc->over = true;
        return td_error(TD_ERR_IO, "cannot start ssh to %s: %s", sc->c->hosts[0].entry, err);
    }
    sc->port_timer = td_loop_timer(l, PORT_WAIT_S, 0, on_port_timeout, sc);
    return TD_OK;
}

/* Should ssh itself hang after its connection was cut. */
static void on_kill(td_loop *l, void *user) {
    (void)l;
    ssh_carrier *sc = user;
    sc->kill_timer = 0;
    for (int i = 0; i < sc->started; i++)
        if (sc->agents[i].pid > 0) kill(sc->agents[i].pid, SIGKILL);
}

static void ssh_stop(td__carrier *base, bool hard) {
    ssh_carrier *sc = (ssh_carrier *)base;
    if (sc->over) return;
    sc->stopping = true;
    td_loop_cancel(td__sup_loop(sc->sup), sc->port_timer);
    sc->port_timer = 0;
    for (int i = 0; i < sc->started; i++) {
        if (hard)
            cut(&sc->agents[i]);
        else
            send_stop(&sc->agents[i]);
    }
    if (hard && !sc->kill_timer)
        sc->kill_timer = td_loop_timer(td__sup_loop(sc->sup), 5.0, 0, on_kill, sc);
    check_over(sc);
}

static void ssh_finish(td__carrier *base);

static const td__carrier_ops ssh_ops = {
    .name = "ssh",
    .start = ssh_start,
    .stop = ssh_stop,
    .finish = ssh_finish,
};

/* ---- artifacts ---- */
/* A pattern the remote shell may expand as a glob: path characters and glob characters only.
 * Anything else is passed quoted (matched literally). */
static int plain_glob(const char *p) {
    for (; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("._-/*?[]", *p)) return 0;
    return 1;
}

/* The declared artifacts, from each host that does not share our file system into RUN/work,
 * node 0's last so that its copy wins (rank 0 writes what a run saves). */
static void fetch_artifacts(ssh_sup *c) {
    const td_exec_job *job = c->job;
    if (!job->nartifacts) return;
    td__buf after = {0};
    td__buf_addf(&after, "tar -xf - -C ");
    td__buf_quote(&after, job->work_dir);
    for (size_t k = c->nhosts; k-- > 0;) {
        host *h = &c->hosts[k];
        if (h->shared || !h->entry) continue; /* no host (an aws node never created) */
        td__buf rs = {0};
        td__buf_addf(&rs, "cd ");
        td__buf_quote(&rs, h->work);
        td__buf_addf(&rs, " || exit 1\nfor f in");
        for (size_t i = 0; i < job->nartifacts; i++) {
            td__buf_add(&rs, " ", 1);
            if (plain_glob(job->artifacts[i]))
                td__buf_add(&rs, job->artifacts[i], strlen(job->artifacts[i]));
            else
                td__buf_quote(&rs, job->artifacts[i]);
        }
        td__buf_addf(&rs, "; do [ -f \"$f\" ] && printf '%%s\\0' \"$f\"; done | "
                          "tar --null -T - -cf -");
        int code = 0;
        char msg[600];
        td_status st = ssh_pipe(c, h, NULL, rs.s, after.s, &code, msg, sizeof msg);
        if (st != TD_OK || code != 0)
            TD_LOG_WARN("artifacts from ssh host %s: %s (exit code %d)", h->entry, msg, code);
        free(rs.s);
    }
    free(after.s);
}

/* After the attempts: the declared artifacts from the hosts. */
static void ssh_finish(td__carrier *base) {
    fetch_artifacts(((ssh_carrier *)base)->c);
}

/* ---- the run ---- */
static char *hosts_file(const td_run *run) {
    return td_run_path(run->run_dir, TD_RUN_PATH_SSH_HOSTS);
}

/* RUN/ssh-hosts: which executor ran the run (td_executor_of_run) and where ("node host
 * remote-dir shared|copied" lines), for tandem show. */
static void write_hosts_file(const ssh_sup *c) {
    td__buf b = {0};
    td__buf_add(&b, "", 0);
    for (size_t i = 0; i < c->nhosts; i++)
        td__buf_addf(&b, "%zu %s %s %s\n", i, c->hosts[i].entry,
                     c->hosts[i].remote ? c->hosts[i].remote : "-",
                     c->hosts[i].remote ? (c->hosts[i].shared ? "shared" : "copied") : "-");
    char *path = hosts_file(c->job->run);
    td_chunk chunk = {b.s, b.len};
    if (td_write_atomic(path, "ssh host list", &chunk, 1) != TD_OK) {
        TD_LOG_WARN("%s", td_error_msg());
        td_error_clear();
    }
    free(path);
    free(b.s);
}

static int ssh_run(const td_exec_job *job) {
    const td_run *run = job->run;
    ssh_sup c = {.job = job};
    double t0 = td_now_s();
    int cli = 1;
    char why[1024];
    char **list = NULL;
    size_t nlist = 0;
    td_status st = td_ssh_hosts(job->ssh, job->project_dir, &list, &nlist);
    if (st != TD_OK) {
        cli = fail_run(&c, t0, "executor ssh: %s", td_error_msg());
        td_error_clear();
        goto out;
    }
    if ((int)nlist != run->nodes) {
        cli = fail_run(&c, t0,
                       "executor ssh: the hostfile names %zu host%s but the workflow has nodes: "
                       "%d (one node per host); make them agree",
                       nlist, nlist == 1 ? "" : "s", run->nodes);
        goto out;
    }
    c.ssh = td__exec_which("ssh");
    if (!c.ssh) {
        cli = fail_run(&c, t0,
                       "executor ssh: ssh is not on PATH; install OpenSSH's client (Debian: "
                       "openssh-client)");
        goto out;
    }
    c.nhosts = nlist;
    c.hosts = td_xcalloc(nlist, sizeof *c.hosts);
    for (size_t i = 0; i < nlist; i++) split_host(list[i], &c.hosts[i]);
    write_hosts_file(&c);
    st = td__exec_read_token(run, c.token);
    if (st != TD_OK) {
        cli = fail_run(&c, t0, "supervisor error: %s", td_error_msg());
        td_error_clear();
        goto out;
    }
    say(&c, "run %s: %zu ssh host%s (%s%s), %d worker%s each", run->id, c.nhosts,
        c.nhosts > 1 ? "s" : "", c.hosts[0].entry, c.nhosts > 1 ? ", ..." : "", run->nproc_per_node,
        run->nproc_per_node > 1 ? "s" : "");
    if (preflight(&c, 0, c.nhosts, true, why, sizeof why) != TD_OK) {
        cli = fail_run(&c, t0, "executor ssh: %s", why);
        goto out;
    }
    write_hosts_file(&c);
    if (copy_code(&c, 0, c.nhosts, why, sizeof why) != TD_OK) {
        cli = fail_run(&c, t0, "executor ssh: %s", why);
        goto out;
    }
    char note[512];
    snprintf(note, sizeof note, "on ssh host%s %s%s", c.nhosts > 1 ? "s" : "", c.hosts[0].entry,
             c.nhosts > 1 ? ", ..." : "");
    st = td_run_set_status(job->store, run->id, TD_RUN_RUNNING, -1, note);
    if (st != TD_OK) {
        cli = fail_run(&c, t0, "supervisor error: %s", td_error_msg());
        td_error_clear();
        goto out;
    }
    /* The agents run their workers with --max-restarts 0: the supervisor restarts the group. */
    ssh_carrier sc = {.base = {&ssh_ops}, .c = &c, .n = (int)c.nhosts, .failed = -1};
    sc.agents = td_xcalloc(c.nhosts, sizeof *sc.agents);
    for (size_t i = 0; i < c.nhosts; i++)
        sc.agents[i].in_fd = sc.agents[i].out_fd = sc.agents[i].err_fd = -1;
    cli = td__supervise(job, &sc.base, job->max_restarts, CUT_AFTER_S, note, t0);
    free(sc.agents);
out:
    for (size_t i = 0; i < c.nhosts; i++) {
        free(c.hosts[i].entry);
        free(c.hosts[i].dest);
        free(c.hosts[i].port);
        free(c.hosts[i].addr);
        free(c.hosts[i].remote);
        free(c.hosts[i].work);
    }
    free(c.hosts);
    td_ssh_hosts_free(list, nlist);
    free(c.ssh);
    return cli;
}

/* ---- the carrier for hosts found one by one (the aws executor's instances) ---- */
struct td__ssh {
    ssh_sup c;
    ssh_carrier sc;
    td_exec_job job; /* the caller's, its ssh options ours */
    td_ssh_options opts;
};

td_status td__ssh_new(const td_exec_job *job, const td_ssh_options *opts, int nodes,
                      td__ssh **out) {
    *out = NULL;
    char *ssh = td__exec_which("ssh");
    if (!ssh)
        return td_error(TD_ERR_NOTFOUND, "ssh is not on PATH; install OpenSSH's client (Debian: "
                                         "openssh-client)");
    td__ssh *s = td_xcalloc(1, sizeof *s);
    s->job = *job;
    td_ssh_options_copy(&s->opts, opts);
    s->job.ssh = &s->opts;
    s->c.job = &s->job;
    s->c.ssh = ssh;
    s->c.nhosts = (size_t)nodes;
    s->c.hosts = td_xcalloc((size_t)nodes, sizeof *s->c.hosts);
    s->sc = (ssh_carrier){.base = {&ssh_ops}, .c = &s->c, .n = nodes, .failed = -1};
    s->sc.agents = td_xcalloc((size_t)nodes, sizeof *s->sc.agents);
    for (int i = 0; i < nodes; i++)
        s->sc.agents[i].in_fd = s->sc.agents[i].out_fd = s->sc.agents[i].err_fd = -1;
    td_status st = td__exec_read_token(job->run, s->c.token);
    if (st != TD_OK) {
        td__ssh_free(s);
        return st;
    }
    *out = s;
    return TD_OK;
}

static void host_clear(host *h) {
    free(h->entry);
    free(h->dest);
    free(h->port);
    free(h->addr);
    free(h->remote);
    free(h->work);
    memset(h, 0, sizeof *h);
}

/* The setup commands on host `node`, in its copy of the code, then the tandem check; their output
 * to RUN/logs/setup-node-N.log here. */
static td_status run_setup(ssh_sup *c, int node, const char *const *setup, size_t nsetup, char *why,
                           size_t nbytes) {
    host *h = &c->hosts[node];
    td__buf s = {0};
    td__buf_addf(&s, "set -e\ncd ");
    td__buf_quote(&s, h->work);
    td__buf_add(&s, "\n", 1);
    for (size_t i = 0; i < nsetup; i++) td__buf_addf(&s, "%s\n", setup[i]);
    add_tandem_check(c, &s);
    char *cmd = remote_sh(s.s);
    free(s.s);
    char **argv = ssh_argv(c, h, cmd);
    free(cmd);
    char *out = NULL, *err = NULL;
    int code = 0;
    double t0 = td_now_s();
    td_status st = td__exec_capture(argv, NULL, SETUP_TIMEOUT_S, &out, &err, &code);
    argv_free(argv);
    char *logs = td_run_path(c->job->run->run_dir, TD_RUN_PATH_LOGS);
    char *path = td_xasprintf("%s/setup-node-%d.log", logs, node);
    td_chunk chunks[2] = {{out ? out : "", out ? strlen(out) : 0},
                          {err ? err : "", err ? strlen(err) : 0}};
    if (td_write_atomic(path, "setup log", chunks, 2) != TD_OK) {
        TD_LOG_WARN("%s", td_error_msg());
        td_error_clear();
    }
    if (st != TD_OK) {
        snprintf(why, nbytes, "aws.setup on %s: %s", h->entry, td_error_msg());
        td_error_clear();
        st = TD_ERR_IO;
    } else if (code != 0) {
        char msg[600];
        td__exec_joined_lines(err && *err ? err : out, msg, sizeof msg);
        snprintf(why, nbytes,
                 "the setup on %s (node %d) failed after %.0f s (exit code %d): %s; "
                 "its output is in %s",
                 h->entry, node, td_now_s() - t0, code, msg[0] ? msg : "no message", path);
        st = code == 255 ? TD_ERR_PEER : TD_ERR_IO;
    }
    free(logs);
    free(path);
    free(out);
    free(err);
    return st;
}

td_status td__ssh_set_host(td__ssh *s, int node, const char *entry, const char *const *setup,
                           size_t nsetup, char *why, size_t nbytes) {
    td_status st = td_ssh_host_check("host", entry);
    if (st != TD_OK) {
        snprintf(why, nbytes, "%s", td_error_msg());
        td_error_clear();
        return st;
    }
    host *h = &s->c.hosts[node];
    host_clear(h);
    split_host(entry, h);
    st = preflight(&s->c, (size_t)node, (size_t)node + 1, nsetup == 0, why, nbytes);
    if (st == TD_OK) st = copy_code(&s->c, (size_t)node, (size_t)node + 1, why, nbytes);
    if (st == TD_OK && nsetup) st = run_setup(&s->c, node, setup, nsetup, why, nbytes);
    return st;
}

/* For a carrier that puts tandem on its hosts itself (the aws executor ships its bundle,
 * exec/bundle.h): where tandem is on every host from now on. */
void td__ssh_set_tandem(td__ssh *s, const char *path) {
    free(s->opts.tandem);
    s->opts.tandem = td_xstrdup(path);
}

/* The ssh command of this carrier (its options) up to and including entry's destination,
 * NULL-terminated, for a command of the caller's own (argv_free's layout: free each, then v). */
char **td__ssh_command_for(const td__ssh *s, const char *entry) {
    host h = {0};
    split_host(entry, &h);
    char **v = ssh_argv(&s->c, &h, "");
    size_t n = 0;
    while (v[n]) n++;
    free(v[n - 1]); /* the empty command: the caller appends its own */
    v[n - 1] = NULL;
    host_clear(&h);
    return v;
}

void td__ssh_tell_agents(td__ssh *s, const char *line) {
    for (int k = 0; k < s->sc.n; k++)
        if (s->sc.agents[k].in_fd >= 0) write_all(s->sc.agents[k].in_fd, line, strlen(line));
}

const char *td__ssh_host(const td__ssh *s, int node) {
    return s->c.hosts[node].entry;
}

void td__ssh_on_note(td__ssh *s, td__ssh_note_fn fn, void *user) {
    s->c.note_hook = fn;
    s->c.note_user = user;
}

td__carrier *td__ssh_carrier(td__ssh *s) {
    return &s->sc.base;
}

void td__ssh_free(td__ssh *s) {
    if (!s) return;
    for (size_t i = 0; i < s->c.nhosts; i++) host_clear(&s->c.hosts[i]);
    free(s->c.hosts);
    free(s->c.ssh);
    free(s->sc.agents);
    td_ssh_options_clear(&s->opts);
    free(s);
}

/* ---- after the supervisor ---- */
/* Nothing outlives a supervisor here: its ssh clients die with it (their death signal), and
 * each agent stops when its stdin ends. */
static td_status ssh_cancel_orphan(const td_run *run, int *cancelled, char *buf, size_t nbytes) {
    (void)run;
    *cancelled = 0;
    if (nbytes) buf[0] = '\0';
    return TD_OK;
}

static char *ssh_describe(const td_run *run) {
    char *path = hosts_file(run);
    FILE *f = fopen(path, "r");
    free(path);
    if (!f) return NULL;
    td__buf b = {0};
    td__buf_addf(&b, "ssh:");
    char line[1200];
    while (fgets(line, sizeof line, f)) {
        char name[300], remote[800], how[16];
        int node;
        if (sscanf(line, "%d %299s %799s %15s", &node, name, remote, how) != 4) continue;
        td__buf_addf(&b, "%s node %d on %s (%s%s%s)", node ? ";" : "", node, name,
                     strcmp(how, "-") ? how : "not reached", strcmp(how, "-") ? " " : "",
                     strcmp(how, "-") ? remote : "");
    }
    fclose(f);
    return b.s;
}

const td_executor td__executor_ssh = {
    .name = "ssh",
    .run = ssh_run,
    .cancel_orphan = ssh_cancel_orphan,
    .describe = ssh_describe,
};
