/* A run that lives in the cloud: tandem run -d of an aws run (exec.h; docs/cloud.md, "The
 * controller"; docs/runs.md, "A run that lives in the cloud").
 *
 * Why a controller instance, and not the submitter: the submitter is a laptop that closes, loses
 * its network or is killed; the run's supervisor must outlive it. Why not node 0: nodes may be
 * spot and interrupted, and the supervisor is what replaces them. So, as SkyPilot's managed
 * jobs do, a small on-demand instance runs the one supervisor of the run (the ordinary detached
 * `tandem run` with executor aws, which creates and replaces the nodes and whose heartbeat feeds
 * their dead-man's switches), and the submitter only hands the run over and reads it back.
 *
 * Three parts, three processes:
 * - the submitter (td_exec_controller_handoff): creates the controller, ships it the workflow,
 *   the code and the credentials over ssh, starts `tandem run -d` there with the run's own id,
 *   writes RUN/remote.json and returns. Nothing of tandem stays on its machine.
 * - the controller's supervisor (td_exec_controller_start/on_loop/finish, in the detached
 *   supervisor, a timer on its event loop): pushes the run directory to S3 as it goes, polls
 *   STORE/stop, feeds its own switch, and at the end pushes the last state and lets the switch
 *   end the instance.
 * - the submitter's verbs later (td_exec_remote_refresh/stop): pull the store back; a stop is a
 *   request object in S3, because the laptop may not reach the controller (no inbound port to
 *   open, no ssh key needed on whoever stops it), and S3 is what both ends reach already.
 * A resume with -d (tandem run --resume RUN -d) is the same handoff to a new controller, whose
 * fresh project first takes the run's last life from the store (td_exec_controller_adopt) and
 * then resumes it as tandem run --resume does anywhere. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "exec/aws_internal.h"
#include "exec/bundle.h"
#include "exec/controller.h"
#include "tandem/loop.h"
#include "tandem/os.h"

#define CTL_TYPE          "t3.micro" /* small, on demand: the controller only supervises */
#define CTL_RUNNING_S     600.0      /* RunInstances to "running" */
#define CTL_SSH_S         300.0      /* "running" to sshd answering */
#define CTL_SETUP_S       3600.0     /* aws.setup on the controller */
#define CTL_BEFORE_LOOP_S 900.0      /* the run's setup: before its supervisor's loop runs */
#define CTL_START_S       120.0      /* `tandem run -d` there, to its run id */
#define CTL_PUSH_PERIOD_S 2.0        /* the store's freshness on the submitter */
#define STORE_SUFFIX      ".tandem-run"

static void nap_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

td_status td_exec_remote_store_url(const char *checkpoint_dir, const char *run_id, char **out) {
    *out = NULL;
    if (!checkpoint_dir || strncmp(checkpoint_dir, "s3://", 5))
        return td_error(TD_ERR_INVALID,
                        "tandem run -d of an aws run keeps the run's store in S3 beside its "
                        "checkpoints, where its controller and this machine both reach it: set "
                        "checkpoint_dir: s3://BUCKET/PREFIX in the workflow (or run it attached, "
                        "without -d)");
    td_s3_url u;
    TD_CHECK(td_s3_url_parse(checkpoint_dir, &u));
    *out = td_xasprintf("s3://%s/%s%s%s/" STORE_SUFFIX, u.bucket, u.key, u.key[0] ? "/" : "",
                        run_id);
    td_s3_url_free(&u);
    return TD_OK;
}

/* ---- remote.json: where a run supervised elsewhere keeps its store ---- */
typedef struct {
    char *store, *region, *profile;
    char controller[32];
} remote_info;

static void remote_info_clear(remote_info *r) {
    free(r->store);
    free(r->region);
    free(r->profile);
    memset(r, 0, sizeof *r);
}

static td_status remote_read(const td_run *run, remote_info *out) {
    memset(out, 0, sizeof *out);
    char *path = td_run_path(run->run_dir, TD_RUN_PATH_REMOTE);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    td_status st = TD_OK;
    const char *store = j ? json_string_value(json_object_get(j, "store")) : NULL;
    if (!store)
        st = td_error(TD_ERR_FORMAT,
                      "%s: %s; it says where run %s, handed to a controller by tandem run -d, "
                      "keeps its store (s3://.../RUN_ID/.tandem-run): restore it, or read the "
                      "store with the AWS CLI",
                      path, j ? "no \"store\" (the run's S3 store)" : je.text, run->id);
    else {
        out->store = td_xstrdup(store);
        const char *v = json_string_value(json_object_get(j, "region"));
        out->region = v ? td_xstrdup(v) : NULL;
        v = json_string_value(json_object_get(j, "profile"));
        out->profile = v ? td_xstrdup(v) : NULL;
        v = json_string_value(json_object_get(json_object_get(j, "controller"), "id"));
        snprintf(out->controller, sizeof out->controller, "%s", v ? v : "");
    }
    json_decref(j);
    free(path);
    return st;
}

static td_status remote_write(const td_run *run, const char *store, const char *region,
                              const char *profile, const td_ec2_instance *ctl, double launched_s,
                              const char *state) {
    json_t *c = json_pack("{s:s, s:s, s:s, s:s, s:f, s:s}", "id", ctl->id, "type", ctl->type,
                          "zone", ctl->zone, "market", "on-demand", "launched_s", launched_s,
                          "state", state);
    json_t *j = json_pack("{s:i, s:s, s:s, s:o}", "format", 1, "store", store, "region", region,
                          "controller", c);
    if (profile) json_object_set_new(j, "profile", json_string(profile));
    char *text = json_dumps(j, JSON_INDENT(1) | JSON_SORT_KEYS);
    json_decref(j);
    char *path = td_run_path(run->run_dir, TD_RUN_PATH_REMOTE);
    td_chunk ch = {text, strlen(text)};
    td_status st = td_write_atomic(path, "the run's remote record", &ch, 1);
    free(path);
    free(text);
    return st;
}

/* ---- the submitter: the controller created, given the run, started ---- */
typedef struct {
    const td_exec_job *job;
    const td_exec_handoff *h;
    const td_aws_options *o;
    td_aws_t *aws;
    td_ec2_instance inst;
    char *ssh;   /* "ssh OPTIONS USER@ADDR", a shell prefix */
    char *dir;   /* "D=DIR": the controller's directory for this run, for the remote shell */
    char *stage; /* here: what is shipped */
} handoff;

static void say(const handoff *c, const char *fmt, ...) TD_PRINTF(2, 3);
static void say(const handoff *c, const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    td__exec_say(c->job->out, "run %s: %s", c->job->run->id, line);
}

/* The controller instance: on demand (an interruption would take the supervisor with it), the
 * nodes' image, key, subnet and security groups, tagged tandem:controller (not tandem:run: the
 * run's own end terminates every instance tagged with the run, and the controller must outlive
 * that to push the end), with the dead-man's switch of every tandem instance in its user data. */
static td_status create_controller(handoff *c, double orphan_s) {
    const td_aws_options *o = c->o;
    const td_run *run = c->job->run;
    char name[160];
    snprintf(name, sizeof name, "tandem-%s-controller", run->id);
    td_ec2_tag tags[4 + 16];
    int ntags = 0;
    tags[ntags++] = (td_ec2_tag){TD_EC2_TAG_CONTROLLER, run->id};
    tags[ntags++] = (td_ec2_tag){TD_EC2_TAG_PROJECT,
                                 c->job->project_dir ? c->job->project_dir : ""};
    tags[ntags++] = (td_ec2_tag){"Name", name};
    /* where tandem gc reads whether its run ended (aws_gc.c), from any project's machine; EC2
     * takes values of 256 characters at most (a longer store: gc reads RUN/remote.json) */
    if (strlen(c->h->store_url) <= 256)
        tags[ntags++] = (td_ec2_tag){TD_EC2_TAG_STORE, c->h->store_url};
    for (size_t k = 0; k < o->ntags && ntags < (int)TD_ARRAY_LEN(tags); k++)
        tags[ntags++] = (td_ec2_tag){o->tags[k].key, o->tags[k].value};
    char token_src[256], token[65];
    /* one per life of the run: a resumed run's new controller is not its first one's (EC2 would
     * answer a token used before with that instance, terminated) */
    snprintf(token_src, sizeof token_src, "%s/%s/controller/%d", c->job->project_dir, run->id,
             run->restarts);
    td_aws_sha256_hex(token_src, strlen(token_src), token);
    token[40] = '\0';
    /* the switch's patience before the supervisor's first word: the setup and the start */
    double first = orphan_s + CTL_BEFORE_LOOP_S + (o->nsetup ? CTL_SETUP_S : 0);
    char *user_data = td_orphan_user_data(orphan_s, first, NULL);
    td_ec2_run_spec spec = {
        .image_id = o->image,
        .instance_type = o->controller_type ? o->controller_type : CTL_TYPE,
        .min_count = 1,
        .max_count = 1,
        .key_name = o->key_name,
        .subnet_id = o->nsubnets ? o->subnets[0] : NULL,
        .security_group_ids = (const char *const *)o->security_groups,
        .nsecurity_groups = (int)o->nsecurity_groups,
        .iam_instance_profile =
            o->controller_profile ? o->controller_profile : o->iam_instance_profile,
        .root_device_name = o->root_device ? o->root_device : "/dev/sda1",
        .tags = tags,
        .ntags = ntags,
        .client_token = token,
        .user_data = user_data,
        .shutdown_terminates = 1,
    };
    td_ec2_instances got = {0};
    td_status st = td_ec2_run_instances(c->aws, &spec, &got);
    free(user_data);
    if (st != TD_OK) return st;
    if (got.count < 1) st = td_error(TD_ERR_PEER, "EC2 RunInstances answered without an instance");
    else c->inst = got.items[0];
    td_ec2_instances_free(&got);
    return st;
}

static td_status wait_running(handoff *c) {
    double end = td_now_s() + CTL_RUNNING_S;
    for (;;) {
        td_ec2_instances got = {0};
        const char *ids[] = {c->inst.id};
        td_status st = td_ec2_describe_instances(c->aws, ids, 1, NULL, NULL, &got);
        if (st == TD_OK && got.count == 1) c->inst = got.items[0];
        td_ec2_instances_free(&got);
        if (st != TD_OK) return st;
        if (!strcmp(c->inst.state, "running") && c->inst.private_ip[0]) return TD_OK;
        if (strcmp(c->inst.state, "pending"))
            return td_error(TD_ERR_PEER, "the controller %s is %s, not running (%s)", c->inst.id,
                            c->inst.state, c->inst.state_reason);
        if (td_now_s() > end)
            return td_error(TD_ERR_TIMEOUT, "the controller %s was not running after %.0f s",
                            c->inst.id, CTL_RUNNING_S);
        nap_s(1.0);
    }
}

/* sh -c script; its output (both streams) in *out. */
static td_status sh(const char *script, double timeout_s, int *code, char **out) {
    char *argv[] = {"/bin/sh", "-c", (char *)script, NULL};
    char *o = NULL, *e = NULL;
    td_status st = td__exec_capture(argv, NULL, timeout_s, &o, &e, code);
    td__buf b = {0};
    if (o) td__buf_addf(&b, "%s", o);
    if (e) td__buf_addf(&b, "%s", e);
    free(o);
    free(e);
    *out = b.s ? b.s : td_xstrdup("");
    return st;
}

/* Runs a command on the controller (its stdin from `in`, a file here, or nothing). */
static td_status on_controller(handoff *c, const char *what, const char *remote, const char *in,
                               double timeout_s, char **out) {
    td__buf b = {0};
    if (in) {
        td__buf_addf(&b, "exec <");
        td__buf_quote(&b, in);
        td__buf_addf(&b, " && ");
    }
    td__buf_addf(&b, "exec %s ", c->ssh);
    td__buf_quote(&b, remote);
    int code = -1;
    char *text = NULL;
    td_status st = sh(b.s, timeout_s, &code, &text);
    free(b.s);
    if (st == TD_OK && code != 0) {
        char lines[1024];
        td__exec_joined_lines(text, lines, sizeof lines);
        st = td_error(TD_ERR_PEER, "%s on the controller %s failed (exit code %d): %s", what,
                      c->inst.id, code, lines[0] ? lines : "no output");
    }
    if (out && st == TD_OK) *out = text;
    else free(text);
    return st;
}

static td_status wait_ssh(handoff *c) {
    double end = td_now_s() + CTL_SSH_S;
    for (;;) {
        char *out = NULL;
        td_status st = on_controller(c, "ssh", "true", NULL, 30, &out);
        free(out);
        if (st == TD_OK) return TD_OK;
        if (td_now_s() > end) return st;
        td_error_clear();
        nap_s(1.0);
    }
}

/* What the controller gets: the workflow file, the code (as the nodes get it), and an env file
 * (0600) with the credentials and the workflow's secrets. */
static td_status stage(handoff *c) {
    char tmpl[] = "/tmp/tandem-controller-XXXXXX";
    if (!mkdtemp(tmpl)) return td_error_errno(TD_ERR_IO, "cannot make a staging directory");
    c->stage = td_xstrdup(tmpl);
    char *wf = td_xasprintf("%s/workflow.yaml", c->stage);
    td_status st = td_copy_file(c->h->workflow_file, wf, "the workflow shipped to the controller");
    free(wf);
    if (st != TD_OK) return st;
    td__buf env = {0};
    td__buf_addf(&env, "# the controller's environment (tandem run -d); private\n");
    /* which instance it is: it puts itself in the run's record (its cost is the run's) */
    td__buf_addf(&env, "TANDEM_CONTROLLER_INSTANCE=%s\nexport TANDEM_CONTROLLER_INSTANCE\n",
                 c->inst.id);
    /* What decides the bits: the controller's supervisor passes them on to the nodes as ours
     * would (ssh.c), so a detached run computes what an attached one does (without them, a
     * submitter's OPENBLAS_CORETYPE reached the nodes of `tandem run` but not of `run -d`). */
    td__buf_export_numerics(&env);
    for (char *const *e = c->h->forward_env; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq) continue;
        td__buf_addf(&env, "%.*s=", (int)(eq - *e), *e);
        td__buf_quote(&env, eq + 1);
        td__buf_addf(&env, "\nexport %.*s\n", (int)(eq - *e), *e);
    }
    char *envp = td_xasprintf("%s/env", c->stage);
    st = td__write_private(envp, "the controller's environment", env.s ? env.s : "");
    td__exec_wipe_free(env.s);
    free(envp);
    if (st != TD_OK) return st;
    /* the code: the nodes' tar stream, kept here as one file */
    char *tar = td_xasprintf("%s/code.tar", c->stage);
    char *script = td__exec_code_tar_script(c->job);
    td__buf b = {0};
    td__buf_addf(&b, "( %s ) >", script);
    td__buf_quote(&b, tar);
    int code = -1;
    char *out = NULL;
    st = sh(b.s, 600, &code, &out);
    if (st == TD_OK && code != 0)
        st = td_error(TD_ERR_IO, "packing the run's code for the controller failed: %s", out);
    free(out);
    free(b.s);
    free(script);
    free(tar);
    return st;
}

static void unstage(handoff *c) {
    if (!c->stage) return;
    static const char *const names[] = {"workflow.yaml", "env", "code.tar", "ship.tar"};
    for (size_t i = 0; i < TD_ARRAY_LEN(names); i++) {
        char *p = td_xasprintf("%s/%s", c->stage, names[i]);
        unlink(p);
        free(p);
    }
    rmdir(c->stage);
    free(c->stage);
    c->stage = NULL;
}

/* This tandem's bundle to the controller (its arch and glibc checked first), over its ssh; the
 * path of the wrapper there in path. */
static td_status ship_tandem(handoff *c, char *path, size_t nbytes) {
    td__bundle bundle = {0};
    TD_CHECK(td__bundle_get(&bundle));
    char where[96];
    snprintf(where, sizeof where, "the controller %s", c->inst.id);
    /* td__bundle_ship appends the remote words to an argv: c->ssh is a shell prefix */
    char *script = td_xasprintf("exec %s \"$@\"", c->ssh);
    char *argv[] = {"/bin/sh", "-c", script, "sh", NULL};
    int64_t sent = 0;
    double t0 = td_now_s();
    td_status st = td__bundle_ship(&bundle, argv, where, path, nbytes, &sent);
    if (st == TD_OK)
        say(c, "tandem shipped to the controller %s in %.1f s (%.1f MB): %s", c->inst.id,
            td_now_s() - t0, (double)sent / 1e6, path);
    free(script);
    td__bundle_clear(&bundle);
    return st;
}

/* Ships the stage, runs aws.setup in the code's copy, and starts the supervisor there: the
 * ordinary detached `tandem run` of the workflow, told the run's id and its store. It prints
 * the id once its supervisor runs; that line is the controller's answer. */
static td_status ship_and_start(handoff *c) {
    const td_aws_options *o = c->o;
    const td_run *run = c->job->run;
    char *ship = td_xasprintf("%s/ship.tar", c->stage);
    td__buf b = {0};
    td__buf_addf(&b, "tar -cf ");
    td__buf_quote(&b, ship);
    td__buf_addf(&b, " -C ");
    td__buf_quote(&b, c->stage);
    td__buf_addf(&b, " workflow.yaml env code.tar");
    int code = -1;
    char *out = NULL;
    td_status st = sh(b.s, 600, &code, &out);
    if (st == TD_OK && code != 0) st = td_error(TD_ERR_IO, "packing for the controller: %s", out);
    free(out);
    free(b.s);
    b = (td__buf){0};
    /* unpack: the code into DIR/project, the rest beside it, private */
    td__buf_addf(&b, "%s && umask 077 && mkdir -p \"$D/project/.tandem\" && cd \"$D\" && "
                     "tar -xf - && tar -xf code.tar -C project && rm -f code.tar",
                 c->dir);
    if (st == TD_OK) st = on_controller(c, "unpacking the run", b.s, ship, 600, NULL);
    free(b.s);
    free(ship);
    if (st != TD_OK) return st;
    /* tandem on the controller: the image's (aws.tandem), else this one, shipped as the nodes
     * get it (bundle.c); the controller's own run ships it on to the nodes from there */
    char shipped[1024];
    const char *tandem = o->tandem;
    if (!tandem) {
        TD_CHECK(ship_tandem(c, shipped, sizeof shipped));
        tandem = shipped;
    }
    /* aws.setup, in the code's copy (an image without tandem installs it there) */
    if (o->nsetup) {
        say(c, "aws.setup on the controller %s", c->inst.id);
        b = (td__buf){0};
        td__buf_addf(&b, "%s && cd \"$D/project\" && set -e", c->dir);
        for (size_t i = 0; i < o->nsetup; i++) {
            td__buf_addf(&b, " && sh -c ");
            td__buf_quote(&b, o->setup[i]);
        }
        td__buf_addf(&b, " >>\"$D/setup.log\" 2>&1 || { tail -5 \"$D/setup.log\" >&2; exit 1; }");
        st = on_controller(c, "aws.setup", b.s, NULL, CTL_SETUP_S, NULL);
        free(b.s);
        if (st != TD_OK) return st;
    }
    b = (td__buf){0};
    td__buf_addf(&b, "%s && cd \"$D/project\" && . ../env && export TANDEM_HOME=\"$PWD\" && exec ",
                 c->dir);
    td__buf_quote(&b, tandem);
    td__buf_addf(&b, " run -f ../workflow.yaml ");
    td__buf_quote(&b, c->h->workflow_name);
    if (c->h->resume) { /* the run's next life: from its store and its S3 checkpoints */
        td__buf_addf(&b, " --resume ");
        td__buf_quote(&b, run->id);
    }
    /* a resume runs the run's stored command (its parameters in it): none given again */
    for (char *const *p = c->h->resume ? NULL : c->h->params; p && *p; p++) {
        td__buf_addf(&b, " --param ");
        td__buf_quote(&b, *p);
    }
    td__buf_addf(&b, " -d --controller-of ");
    td__buf_quote(&b, run->id);
    td__buf_addf(&b, " --controller-store ");
    td__buf_quote(&b, c->h->store_url);
    td__buf_addf(&b, " </dev/null 2>>\"$D/run.log\"");
    out = NULL;
    st = on_controller(c, "starting the run's supervisor", b.s, NULL, CTL_START_S, &out);
    free(b.s);
    if (st == TD_OK) {
        char first[128] = "";
        sscanf(out, "%127s", first);
        if (strcmp(first, run->id))
            st = td_error(TD_ERR_PEER,
                          "the controller %s started run '%s', not %s (its project already had "
                          "runs of this workflow?): %s",
                          c->inst.id, first, run->id, out);
    }
    free(out);
    return st;
}

static void terminate_controller(handoff *c) {
    if (!c->inst.id[0]) return;
    const char *ids[] = {c->inst.id};
    td_ec2_instances got = {0};
    if (td_ec2_terminate_instances(c->aws, ids, 1, &got) != TD_OK) {
        say(c, "WARNING: could not terminate the controller %s: %s; terminate it by hand (it "
               "ends itself after aws.orphan_timeout)",
            c->inst.id, td_error_msg());
        td_error_clear();
    } else {
        say(c, "terminated the controller %s", c->inst.id);
    }
    td_ec2_instances_free(&got);
}

td_status td_exec_controller_handoff(const td_exec_job *job, const td_exec_handoff *h) {
    const td_aws_options *o = job->aws;
    handoff c = {.job = job, .h = h, .o = o};
    double orphan_s = o->orphan_timeout_s > 0 ? o->orphan_timeout_s : TD_AWS_ORPHAN_TIMEOUT_S;
    td_s3_url u = {0};
    TD_CHECK(td_s3_url_parse(h->store_url, &u));
    td_aws_opts ao = {.profile = o->profile, .region = o->region};
    td_status st = td_aws_new(&ao, &c.aws);
    /* the store answers before anything is created: a missing bucket costs no instance */
    char *key = td_xasprintf("%s/submitted.json", u.key);
    if (st == TD_OK) {
        char *body = td_xasprintf("{\"run\": \"%s\", \"submitted_s\": %.1f}\n", job->run->id,
                                  td_wall_s());
        st = td_s3_put_buffer(c.aws, u.bucket, key, body, strlen(body));
        free(body);
        if (st != TD_OK)
            st = td_error(st, "the run's store %s cannot be written: %s; create the bucket (aws "
                              "s3 mb s3://%s) or change checkpoint_dir",
                          h->store_url, td_error_msg(), u.bucket);
    }
    free(key);
    /* a resume: the stop that ended the last life would stop this one at its first poll */
    if (st == TD_OK && h->resume) {
        key = td_xasprintf("%s/stop", u.key);
        st = td_s3_delete(c.aws, u.bucket, key);
        if (st != TD_OK)
            st = td_error(st, "the stop request of run %s's last life (s3://%s/%s) cannot be "
                              "cleared: %s; the resumed run would stop at once",
                          job->run->id, u.bucket, key, td_error_msg());
        free(key);
    }
    double launched = td_wall_s();
    if (st == TD_OK) st = create_controller(&c, orphan_s);
    if (st == TD_OK) st = stage(&c);
    if (st == TD_OK) {
        say(&c, "controller %s (%s on-demand) created; the run's store is %s", c.inst.id,
            c.inst.type, h->store_url);
        st = remote_write(job->run, h->store_url, td_aws_region(c.aws), o->profile, &c.inst,
                          launched, "pending");
    }
    if (st == TD_OK) st = wait_running(&c);
    if (st == TD_OK) {
        const char *addr = o->public_address > 0 ||
                                   (o->public_address == 0 && c.inst.public_ip[0])
                               ? c.inst.public_ip
                               : c.inst.private_ip;
        td__buf b = {0};
        td__buf_addf(&b, "ssh -o BatchMode=yes -o StrictHostKeyChecking=no "
                         "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout=10");
        if (o->ssh_key) {
            td__buf_addf(&b, " -i ");
            td__buf_quote(&b, o->ssh_key);
        }
        td__buf_addf(&b, " ");
        char *dest = td_xasprintf("%s@%s", o->user ? o->user : "ubuntu", addr);
        td__buf_quote(&b, dest);
        free(dest);
        c.ssh = b.s;
        /* D=... : the controller's directory of the run, a shell assignment that each remote
         * command starts with (relative to the login's home unless aws.work_dir is absolute) */
        td__buf d = {0};
        const char *base = o->work_dir ? o->work_dir : ".tandem-controller";
        td__buf_addf(&d, "D=%s", base[0] == '/' ? "" : "\"$HOME\"/");
        char *rel = td_xasprintf("%s/%s", base, job->run->id);
        td__buf_quote(&d, rel);
        free(rel);
        c.dir = d.s;
        say(&c, "waiting for the controller %s (%s) to answer ssh", c.inst.id, addr);
        st = wait_ssh(&c);
    }
    if (st == TD_OK) st = ship_and_start(&c);
    if (st == TD_OK)
        st = remote_write(job->run, h->store_url, td_aws_region(c.aws), o->profile, &c.inst,
                          launched, "running");
    if (st == TD_OK) {
        char *note = td_xasprintf("supervised by its controller %s; store %s", c.inst.id,
                                  h->store_url);
        st = td_run_set_status(job->store, job->run->id, TD_RUN_RUNNING, -1, note);
        free(note);
        say(&c, "handed to the controller %s: this machine may go away; tandem ps/show/logs/"
                "metrics attach, tandem stop %s stops it",
            c.inst.id, job->run->id);
    }
    if (st != TD_OK) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", td_error_msg());
        terminate_controller(&c);
        /* nobody supervises it elsewhere: it is an ordinary failed run of this machine */
        char *remote = td_run_path(job->run->run_dir, TD_RUN_PATH_REMOTE);
        unlink(remote);
        free(remote);
        st = td_error(st, "tandem run -d: the run could not be handed to a controller: %s", msg);
    }
    unstage(&c);
    free(c.ssh);
    free(c.dir);
    td_aws_free(c.aws);
    td_s3_url_free(&u);
    return st;
}

/* ---- the controller: push, stop requests, its own switch ----
 * On the supervisor's event loop (ARCHITECTURE.md: periodic work is a timer on the one loop):
 * every CTL_PUSH_PERIOD_S a tick queues one pass, the S3 push and the stop poll, which block, on
 * the loop's work threads (td_loop_queue_work); its after(), back on the loop's thread, acts on
 * a stop and feeds the switch. One pass at a time: a tick while one runs is skipped, so a slow
 * S3 delays the store rather than piling up passes over the same files (td__push is not shared
 * between passes running at once). */
struct td_exec_controller {
    uint64_t pass;    /* the pass queued or running (0: none) */
    bool beat;        /* this pass feeds the switch and puts the controller's word */
    bool stop_found;  /* the pass found STORE/stop (written by the pass, read in its after()) */
    double next_beat; /* monotonic: when the switch is fed next */
    char *project_dir, *run_id, *run_dir, *bucket, *prefix, *heard, *stage;
    double orphan_s;
    td_aws_t *aws;
    td__push push;
    bool stop_seen;
    char *self;   /* the controller's instance id (TANDEM_CONTROLLER_INSTANCE), NULL: unknown */
    char *prices; /* aws.prices, for its own price */
};

/* The controller in the run's record (RUN/instances.json), once the nodes are terminated (the
 * run's end terminates every instance its record lists as alive: the controller is added after
 * that, ended now, as it is about to end itself): its on-demand price and hours count in the
 * run's cost like any node's. node null: it is no node. */
static void record_self(td_exec_controller *c) {
    if (!c->self) return;
    const char *ids[] = {c->self};
    td_ec2_instances got = {0};
    td_status st = td_ec2_describe_instances(c->aws, ids, 1, NULL, NULL, &got);
    if (st == TD_OK && got.count == 1) {
        td_run_instance in;
        td__aws_controller_from_ec2(&got.items[0], td_aws_region(c->aws), c->prices, &in);
        in.ended_s = td_wall_s();
        in.end = (char *)"the run's controller: it ended itself after the run";
        snprintf(in.state, sizeof in.state, "shutting-down");
        st = td__aws_record_update(c->run_dir, td_aws_region(c->aws), &in, 1);
    }
    td_ec2_instances_free(&got);
    if (st != TD_OK) {
        TD_LOG_WARN("run %s: the controller %s could not put itself in the run's record: %s",
                    c->run_id, c->self, td_error_msg());
        td_error_clear();
    }
}

/* The switch's file (TD_ORPHAN_HEARD_PATH): its time is when the supervisor promised to speak
 * again; at the end the promise is now, and the watch ends the instance. */
static void promise(td_exec_controller *c, double until_s) {
    int fd = open(c->heard, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) return; /* not an instance of tandem's (no switch here) */
    struct timespec t[2];
    t[0].tv_sec = t[1].tv_sec = (time_t)until_s;
    t[0].tv_nsec = t[1].tv_nsec = 0;
    futimens(fd, t);
    close(fd);
}

static void push_now(td_exec_controller *c, const char *when) {
    if (td__remote_push(&c->push, c->run_dir, td_now_s(), false) != TD_OK) {
        TD_LOG_WARN("run store: pushing %s to s3://%s/%s %s: %s; tried again in %.0f s", c->run_dir,
                    c->bucket, c->prefix, when, td_error_msg(), CTL_PUSH_PERIOD_S);
        td_error_clear();
    }
}

/* Whether the submitter asked for a stop (STORE/stop exists). Blocks: on a work thread. */
static bool stop_asked(td_exec_controller *c) {
    char *key = td_xasprintf("%s/stop", c->prefix);
    td_s3_object o = {0};
    td_status st = td_s3_head(c->aws, c->bucket, key, &o);
    td_s3_object_free(&o);
    free(key);
    if (st != TD_OK) td_error_clear(); /* absent, or unreadable now: asked again next pass */
    return st == TD_OK;
}

/* A stop asked from the submitter: recorded as a user's stop, then the SIGTERM tandem stop
 * would send (the supervisor reads it from its signalfd; every thread has it blocked). On the
 * loop's thread; once. */
static void act_on_stop(td_exec_controller *c) {
    c->stop_seen = true;
    TD_LOG_INFO("run %s: a stop was asked through its store (s3://%s/%s/stop)", c->run_id,
                c->bucket, c->prefix);
    td_rundb *db = NULL;
    if (td_rundb_open(c->project_dir, &db) == TD_OK) {
        if (td_run_request_stop(db, c->run_id, 1) != TD_OK) td_error_clear();
        td_rundb_close(db);
    } else {
        td_error_clear();
    }
    kill(getpid(), SIGTERM);
}

/* The controller's word in the store (TD_CONTROLLER_WORD): which instance it is, when it spoke,
 * until when its switch waits (until_s). tandem gc reads it to tell a live controller from one
 * whose switch failed. Blocks: on a work thread, or at the end. */
static void put_word(td_exec_controller *c, double until_s, bool ended) {
    json_t *j = json_pack("{s:i, s:s, s:s?, s:f, s:f, s:f, s:b}", "format", 1, "run", c->run_id,
                          "instance", c->self, "heard_s", td_wall_s(), "promise_s", until_s,
                          "orphan_timeout_s", c->orphan_s, "ended", ended);
    char *text = json_dumps(j, JSON_SORT_KEYS);
    json_decref(j);
    char *key = td_xasprintf("%s/%s", c->prefix, TD_CONTROLLER_WORD);
    if (td_s3_put_buffer(c->aws, c->bucket, key, text, strlen(text)) != TD_OK) {
        TD_LOG_WARN("run %s: the controller's word to s3://%s/%s: %s; said again at its next "
                    "heartbeat",
                    c->run_id, c->bucket, key, td_error_msg());
        td_error_clear();
    }
    free(key);
    free(text);
}

/* One pass, on a work thread: touches only the pass's own state (push, stop_found), never the
 * loop. */
static void pass_work(void *user) {
    td_exec_controller *c = user;
    push_now(c, "as it runs");
    c->stop_found = !c->stop_seen && stop_asked(c);
    if (c->beat) put_word(c, td_wall_s() + c->orphan_s, false);
}

/* The pass done, on the loop's thread: the stop acted on, the switch fed (a controller whose
 * passes stopped coming back has a supervisor that no longer works: the switch ends it). */
static void pass_after(td_loop *l, void *user) {
    (void)l;
    td_exec_controller *c = user;
    c->pass = 0;
    if (c->stop_found && !c->stop_seen) act_on_stop(c);
    if (c->beat) {
        promise(c, td_wall_s() + c->orphan_s);
        c->next_beat = td_now_s() + td_orphan_heartbeat_s(c->orphan_s);
        c->beat = false;
    }
}

static void on_tick(td_loop *l, void *user) {
    td_exec_controller *c = user;
    if (c->pass) return; /* the last pass still runs: this tick is skipped */
    c->beat = td_now_s() >= c->next_beat;
    c->pass = td_loop_queue_work(l, pass_work, pass_after, c);
    if (!c->pass) {
        TD_LOG_WARN("run %s: the controller's push to s3://%s/%s could not be queued: %s; tried "
                    "again in %.0f s",
                    c->run_id, c->bucket, c->prefix, td_error_msg(), CTL_PUSH_PERIOD_S);
        td_error_clear();
    }
}

void td_exec_controller_on_loop(td_loop *loop, void *controller) {
    td_exec_controller *c = controller;
    if (!c) return;
    c->pass = 0;
    /* the first pass now, as the run starts; td_loop_free ends the timer and a pass left */
    td_loop_timer(loop, 0, CTL_PUSH_PERIOD_S, on_tick, c);
}

td_status td_exec_controller_start(const td_run *run, const char *project_dir,
                                   const td_aws_options *aws, const char *store_url,
                                   td_exec_controller **out) {
    *out = NULL;
    td_s3_url u;
    TD_CHECK(td_s3_url_parse(store_url, &u));
    td_exec_controller *c = td_xcalloc(1, sizeof *c);
    c->bucket = u.bucket;
    c->prefix = u.key;
    c->project_dir = td_xstrdup(project_dir);
    c->run_id = td_xstrdup(run->id);
    c->run_dir = td_xstrdup(run->run_dir);
    const char *heard = getenv("TANDEM_ORPHAN_HEARD");
    c->heard = td_xstrdup(heard && *heard ? heard : TD_ORPHAN_HEARD_PATH);
    const char *self = getenv("TANDEM_CONTROLLER_INSTANCE");
    c->self = self && *self ? td_xstrdup(self) : NULL;
    c->prices = aws && aws->prices ? td_xstrdup(aws->prices) : NULL;
    c->orphan_s = aws && aws->orphan_timeout_s > 0 ? aws->orphan_timeout_s
                                                   : TD_AWS_ORPHAN_TIMEOUT_S;
    char tmpl[] = "/tmp/tandem-push-XXXXXX";
    td_status st = mkdtemp(tmpl) ? TD_OK : td_error_errno(TD_ERR_IO, "a staging directory");
    c->stage = td_xstrdup(tmpl);
    td_aws_opts ao = {.profile = aws ? aws->profile : NULL, .region = aws ? aws->region : NULL};
    if (st == TD_OK) st = td_aws_new(&ao, &c->aws);
    c->push = (td__push){.aws = c->aws, .bucket = c->bucket, .prefix = c->prefix,
                         .staging = c->stage};
    if (st == TD_OK) {
        /* until the supervisor's loop feeds it: the workflow's setup: and the executor's
         * preparation run first (as patient as the switch is before a supervisor's first word) */
        promise(c, td_wall_s() + c->orphan_s + CTL_BEFORE_LOOP_S);
        put_word(c, td_wall_s() + c->orphan_s + CTL_BEFORE_LOOP_S, false);
        c->next_beat = td_now_s() + td_orphan_heartbeat_s(c->orphan_s);
    }
    if (st != TD_OK) {
        td_exec_controller_finish(c);
        return st;
    }
    TD_LOG_INFO("run %s: controller: the run directory goes to %s as it runs; a stop is asked "
                "with %s/stop",
                run->id, store_url, store_url);
    *out = c;
    return TD_OK;
}

void td_exec_controller_finish(td_exec_controller *c) {
    if (!c) return;
    /* the supervisor's loop has ended (its td_loop_free waited for a pass left running): the
     * push below is the only one */
    if (c->aws) {
        record_self(c);
        /* the last state, pushed until it went (the end is what the submitter waits for) */
        for (int i = 0; i < 5; i++) {
            if (td__remote_push(&c->push, c->run_dir, td_now_s(), true) == TD_OK) break;
            TD_LOG_WARN("run store: the last push to s3://%s/%s: %s", c->bucket, c->prefix,
                        td_error_msg());
            td_error_clear();
            nap_s(2.0 * (i + 1));
        }
        TD_LOG_INFO("run %s: controller: the run has ended and its store is pushed; this "
                    "instance ends itself now (its dead-man's switch)",
                    c->run_id);
        put_word(c, td_wall_s() - 1, true);
        promise(c, td_wall_s() - 1);
    }
    td__remote_push_free(&c->push);
    td_aws_free(c->aws);
    if (c->stage) rmdir(c->stage);
    free(c->stage);
    free(c->bucket);
    free(c->prefix);
    free(c->project_dir);
    free(c->run_id);
    free(c->run_dir);
    free(c->heard);
    free(c->self);
    free(c->prices);
    free(c);
}

/* ---- a resume of a run that lived here: its last life sent to the store first ---- */
td_status td_exec_remote_seed(const td_aws_options *aws, const char *store_url,
                              const td_run *run) {
    td_s3_url u;
    TD_CHECK(td_s3_url_parse(store_url, &u));
    td_aws_opts ao = {.profile = aws ? aws->profile : NULL, .region = aws ? aws->region : NULL};
    td_aws_t *client = NULL;
    char tmpl[] = "/tmp/tandem-push-XXXXXX";
    td_status st = td_aws_new(&ao, &client);
    if (st == TD_OK && !mkdtemp(tmpl)) st = td_error_errno(TD_ERR_IO, "a staging directory");
    td__push p = {.aws = client, .bucket = u.bucket, .prefix = u.key, .staging = tmpl};
    if (st == TD_OK) st = td__remote_push(&p, run->run_dir, td_now_s(), true);
    if (st != TD_OK)
        st = td_error(st, "run %s's directory could not be sent to its store %s for the "
                          "controller that resumes it: %s",
                      run->id, store_url, td_error_msg());
    td__remote_push_free(&p);
    rmdir(tmpl);
    td_aws_free(client);
    td_s3_url_free(&u);
    return st;
}

/* ---- the resumed run's new controller: its last life pulled from the store ---- */
td_status td_exec_controller_adopt(td_rundb *store, const td_aws_options *aws,
                                   const char *store_url, const char *run_id) {
    if (!run_id[0] || strchr(run_id, '/') || run_id[0] == '.')
        return td_error(TD_ERR_INVALID, "--controller-of '%s': not a run id", run_id);
    td_s3_url u;
    TD_CHECK(td_s3_url_parse(store_url, &u));
    char *run_dir = td_xasprintf("%s/runs/%s", td_rundb_dir(store), run_id);
    td_aws_opts ao = {.profile = aws ? aws->profile : NULL, .region = aws ? aws->region : NULL};
    td_aws_t *client = NULL;
    size_t n = 0;
    td_status st = td_mkdirs(run_dir);
    if (st == TD_OK) st = td_aws_new(&ao, &client);
    if (st == TD_OK) st = td__remote_pull(client, u.bucket, u.key, run_dir, &n);
    /* the pull's own bookkeeping: this machine's run is no pulled copy, it pushes */
    char *etags = td_xasprintf("%s/.remote-etags", run_dir);
    unlink(etags);
    free(etags);
    char *record = td_run_path(run_dir, TD_RUN_PATH_RECORD);
    if (st == TD_OK && access(record, F_OK) != 0)
        st = td_error(TD_ERR_NOTFOUND,
                      "run %s's store %s has no run/%s: nothing of its last life to resume "
                      "(was it ever started by a controller?)",
                      run_id, store_url, td_run_path_name(TD_RUN_PATH_RECORD));
    free(record);
    if (st == TD_OK) st = td_rundb_rebuild(store, NULL, NULL, NULL);
    if (st == TD_OK)
        TD_LOG_INFO("run %s: its last life pulled from %s (%zu files) to be resumed here", run_id,
                    store_url, n);
    td_aws_free(client);
    free(run_dir);
    td_s3_url_free(&u);
    return st;
}

/* ---- the submitter's verbs: attach ---- */
static td_status remote_client(const td_run *run, remote_info *ri, td_s3_url *u, td_aws_t **aws) {
    *aws = NULL;
    memset(u, 0, sizeof *u);
    TD_CHECK(remote_read(run, ri));
    td_status st = td_s3_url_parse(ri->store, u);
    td_aws_opts ao = {.profile = ri->profile, .region = ri->region};
    if (st == TD_OK) st = td_aws_new(&ao, aws);
    return st;
}

td_status td_exec_remote_refresh(td_rundb *store, td_run *run) {
    if (!td_run_is_remote(run)) return TD_OK;
    remote_info ri;
    td_s3_url u;
    td_aws_t *aws = NULL;
    size_t n = 0;
    td_status st = remote_client(run, &ri, &u, &aws);
    if (st == TD_OK) st = td__remote_pull(aws, u.bucket, u.key, run->run_dir, &n);
    if (st != TD_OK)
        st = td_error(st, "run %s lives in the cloud (its controller %s); its store %s could not "
                          "be read: %s",
                      run->id, ri.controller[0] ? ri.controller : "?",
                      ri.store ? ri.store : "(remote.json)", td_error_msg());
    if (st == TD_OK) st = td_run_adopt_remote(store, run);
    td_aws_free(aws);
    td_s3_url_free(&u);
    remote_info_clear(&ri);
    return st;
}

td_status td_exec_remote_stop(td_rundb *store, td_run *run, double wait_s) {
    remote_info ri;
    td_s3_url u;
    td_aws_t *aws = NULL;
    td_status st = remote_client(run, &ri, &u, &aws);
    if (st == TD_OK) {
        char *key = td_xasprintf("%s/stop", u.key);
        char *body = td_xasprintf("{\"run\": \"%s\", \"requested_s\": %.1f}\n", run->id,
                                  td_wall_s());
        st = td_s3_put_buffer(aws, u.bucket, key, body, strlen(body));
        free(body);
        free(key);
    }
    td_aws_free(aws);
    td_s3_url_free(&u);
    remote_info_clear(&ri);
    double end = td_now_s() + wait_s;
    while (st == TD_OK && !td_run_status_is_final(run->status) && td_now_s() < end) {
        nap_s(1.0);
        st = td_exec_remote_refresh(store, run);
    }
    return st;
}
