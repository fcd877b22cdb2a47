/* Nothing keeps billing: the instances of a run whose supervisor is gone (killed -9, its machine
 * rebooted) are found and terminated, by three ways in:
 *   - tandem stop RUN (td__aws_cancel_orphan, the executor's cancel_orphan), as Slurm's cancels
 *     a job its dead supervisor left queued;
 *   - tandem run and tandem ps (td_gc_orphans): only when a run's RUN/instances.json lists an
 *     instance still alive and nobody holds its RUN/lock; otherwise no AWS call at all, so ps
 *     stays fast and works offline;
 *   - tandem gc (td_gc_instances): every instance of the region tagged tandem:run, whatever the
 *     records say (a supervisor killed between RunInstances and writing its record); and every
 *     controller of a detached run (tagged tandem:controller) whose run has ended or whose
 *     dead-man's switch failed, as its store in S3 says (gc_controllers, below).
 *
 * "The supervisor is gone" is "nobody holds RUN/lock": tandem run takes that flock before it
 * touches the run and its supervisor holds it to its end (src/workflow/run.c, lock_run), so a
 * free lock means no supervisor, and taking it keeps a resume from starting while instances are
 * being terminated under it. */
#include <dirent.h>
#include <jansson.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "exec/aws_internal.h"
#include "exec/controller.h"

#define END_ORPHAN TD__AWS_END_GC " (its supervisor was gone)"

/* ---- the run's lock ---- */
/* Takes run_dir/lock if nobody holds it: 1 with *fd (close it to release), 0 when it is held (a
 * live supervisor, or another gc at work), -1 when it cannot be opened (no run directory). */
static int lock_take(const char *run_dir, int *fd) {
    *fd = -1;
    /* tandem run -d handed the run to its controller in the cloud (controller.c): its supervisor
     * lives there, not here, and nobody here holds the lock */
    char *remote = td_run_path(run_dir, TD_RUN_PATH_REMOTE);
    int elsewhere = access(remote, F_OK) == 0;
    free(remote);
    if (elsewhere) return 0;
    char *path = td_run_path(run_dir, TD_RUN_PATH_LOCK);
    *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    free(path);
    if (*fd < 0) return -1;
    if (flock(*fd, LOCK_EX | LOCK_NB) == 0) return 1;
    close(*fd);
    *fd = -1;
    return 0;
}

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* <project>/.tandem/runs/<id> of a run directory, back to <project> (caller frees). */
static char *project_of_run_dir(const char *run_dir) {
    char *p = td_xstrdup(run_dir);
    for (int i = 0; i < 3; i++) {
        char *slash = strrchr(p, '/');
        if (!slash) break;
        *slash = '\0';
    }
    return p;
}

/* The run directory of run_id in project (caller frees), or NULL when this machine has none. An
 * id that could climb out of runs/ is no run of anyone's. */
static char *run_dir_of(const char *project, const char *run_id) {
    if (!*project || !*run_id || strchr(run_id, '/') || !strcmp(run_id, ".") ||
        !strcmp(run_id, ".."))
        return NULL;
    char *dir = td_xasprintf("%s/.tandem/runs/%s", project, run_id);
    if (is_dir(dir)) return dir;
    free(dir);
    return NULL;
}

static int state_live(const char *state) {
    return strcmp(state, "terminated") && strcmp(state, "shutting-down");
}

/* Tags are anyone's text (the console edits them): what reaches a terminal loses its control
 * bytes. In place. */
static char *printable(char *s) {
    for (unsigned char *p = (unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f) *p = '?';
    return s;
}

/* "t3.micro spot, node 1 of run X, up 0.40 h"; a controller (tandem:controller) says
 * "controller of run X". */
static void describe(const td_ec2_instance *e, double now, char *out, size_t nbytes) {
    char up[32] = "", role[24] = "node ?";
    double launched = td__aws_parse_time(e->launch_time);
    if (launched > 0) td__aws_fmt_lifetime(now > launched ? now - launched : 0, up, sizeof up);
    if (e->controller_of[0]) snprintf(role, sizeof role, "controller");
    else if (e->node >= 0) snprintf(role, sizeof role, "node %d", e->node);
    const char *run = e->controller_of[0] ? e->controller_of : e->run_id;
    snprintf(out, nbytes, "%s %s, %s of run %s%s%s", e->type[0] ? e->type : "?",
             !strcmp(e->lifecycle, "spot") ? "spot" : "on-demand", role, run[0] ? run : "?",
             *up ? ", " : "", up);
    printable(out);
}

static td_status new_client(const char *region, td_aws_t **aws) {
    td_aws_opts o = {.region = region && *region ? region : NULL};
    return td_aws_new(&o, aws);
}

/* ---- terminating a list and recording it ---- */
/* Terminates the n instances (one call), says so per instance on out ("terminated ...") and
 * records each end in run_dir's record when run_dir is not NULL. The caller holds the run's
 * lock. *nterminated, and the ids joined in ids (may be NULL). */
static td_status terminate_list(td_aws_t *aws, const td_ec2_instance *list, int n,
                                const char *run_dir, const char *end, FILE *out, int *nterminated,
                                char *ids, size_t ids_nbytes) {
    if (n <= 0) return TD_OK;
    const char **idv = td_xcalloc((size_t)n, sizeof *idv);
    for (int i = 0; i < n; i++) idv[i] = list[i].id;
    td_ec2_instances res = {0};
    td_status st = td_ec2_terminate_instances(aws, idv, n, &res);
    free(idv);
    if (st != TD_OK) return st;
    double now = td_wall_s();
    td_run_instances rec = {0};
    int have_rec = 0;
    if (run_dir) {
        td_status rs = td_run_instances_read(run_dir, &rec);
        if (rs == TD_OK || rs == TD_ERR_NOTFOUND) {
            have_rec = 1;
            td_error_clear();
            if (!rec.provider[0]) snprintf(rec.provider, sizeof rec.provider, "aws");
            if (!rec.region[0]) snprintf(rec.region, sizeof rec.region, "%s", td_aws_region(aws));
        } else {
            /* A record nobody can read is not written over: the terminations still stand. */
            TD_LOG_WARN("%s; the ends of the instances terminated now are not recorded there",
                        td_error_msg());
            td_error_clear();
        }
    }
    for (int i = 0; i < n; i++) {
        const td_ec2_instance *e = &list[i];
        const char *state = "shutting-down";
        for (int j = 0; j < res.count; j++)
            if (!strcmp(res.items[j].id, e->id) && res.items[j].state[0])
                state = res.items[j].state;
        char what[256];
        describe(e, now, what, sizeof what);
        if (out)
            fprintf(out, "%sterminated %s (%s)\n", out == stderr ? "tandem: " : "", e->id, what);
        if (nterminated) (*nterminated)++;
        if (ids && ids_nbytes) {
            size_t len = strlen(ids);
            snprintf(ids + len, ids_nbytes - len, "%s%s", len ? ", " : "", e->id);
        }
        if (have_rec) {
            if (!td__aws_record_find(&rec, e->id)) {
                /* Its supervisor died before it recorded the instance, or it is the run's
                 * controller, which records itself only when it ends itself: it is recorded
                 * now, a controller (no node) at its on-demand price as it would have. */
                td_run_instance in;
                if (e->controller_of[0])
                    td__aws_controller_from_ec2(e, td_aws_region(aws), NULL, &in);
                else
                    td__aws_instance_from_ec2(e, &in);
                td__aws_record_put(&rec, &in);
            }
            td__aws_record_end(&rec, e->id, now, end, state);
        }
    }
    if (out) fflush(out);
    td_ec2_instances_free(&res);
    if (have_rec) {
        st = td__aws_record_write(run_dir, &rec);
        td_run_instances_clear(&rec);
    }
    return st;
}

/* The record's live entries that EC2 did not list as the run's live instances: each looked up by
 * id. A live one joins *targets; one EC2 reports ended, or no longer knows, is recorded
 * "lost (...)" (ended now: when it really ended is unknown), so the record stops claiming it. */
static td_status reconcile(td_aws_t *aws, td_run_instances *rec, const char *run_dir,
                           td_ec2_instances *targets) {
    int changed = 0;
    double now = td_wall_s();
    for (size_t i = 0; i < rec->count; i++) {
        td_run_instance *in = &rec->items[i];
        if (!td_run_instance_live(in)) continue;
        int listed = 0;
        for (int j = 0; j < targets->count; j++) listed |= !strcmp(targets->items[j].id, in->id);
        if (listed) continue;
        const char *id = in->id;
        td_ec2_instances one = {0};
        td_status st = td_ec2_describe_instances(aws, &id, 1, NULL, NULL, &one);
        if (st == TD_ERR_NOTFOUND || (st == TD_OK && one.count == 0)) {
            td_error_clear();
            td__aws_record_end(rec, id, now, "lost (EC2 no longer knows it)", "terminated");
            changed = 1;
        } else if (st != TD_OK) {
            return st;
        } else if (state_live(one.items[0].state)) {
            targets->items =
                td_xrealloc(targets->items, (size_t)(targets->count + 1) * sizeof *targets->items);
            targets->items[targets->count++] = one.items[0];
        } else {
            char why[400];
            snprintf(why, sizeof why, "lost (EC2 reports it %s%s%s)", one.items[0].state,
                     one.items[0].state_reason[0] ? ": " : "", one.items[0].state_reason);
            td__aws_record_end(rec, id, now, why, one.items[0].state);
            changed = 1;
        }
        td_ec2_instances_free(&one);
    }
    return changed ? td__aws_record_write(run_dir, rec) : TD_OK;
}

td_status td__aws_terminate_run(td_aws_t *aws, const char *project_dir, const char *run_dir,
                                const char *run_id, const char *end, FILE *out, int *nterminated,
                                char *ids, size_t ids_nbytes) {
    if (nterminated) *nterminated = 0;
    if (ids && ids_nbytes) ids[0] = '\0';
    td_run_instances rec = {0};
    td_status st = run_dir ? td_run_instances_read(run_dir, &rec) : TD_ERR_NOTFOUND;
    if (st != TD_OK && st != TD_ERR_NOTFOUND) return st;
    td_error_clear();
    td_ec2_instances found = {0}, targets = {0};
    st = td_ec2_describe_instances(aws, NULL, 0, run_id, NULL, &found);
    if (st != TD_OK) goto out;
    /* The run's id names runs of other projects too ("train-3"): only this project's. */
    for (int i = 0; i < found.count; i++) {
        const td_ec2_instance *e = &found.items[i];
        int ours = e->project[0] ? !strcmp(e->project, project_dir)
                                 : td__aws_record_find(&rec, e->id) != NULL;
        if (!ours || !state_live(e->state)) continue;
        targets.items =
            td_xrealloc(targets.items, (size_t)(targets.count + 1) * sizeof *targets.items);
        targets.items[targets.count++] = *e;
    }
    if (run_dir && rec.count) st = reconcile(aws, &rec, run_dir, &targets);
    if (st == TD_OK)
        st = terminate_list(aws, targets.items, targets.count, run_dir, end, out, nterminated, ids,
                            ids_nbytes);
out:
    td_ec2_instances_free(&found);
    td_ec2_instances_free(&targets);
    td_run_instances_clear(&rec);
    return st;
}

/* ---- tandem stop: cancel_orphan ---- */
/* Whether run_dir's record lists an instance still alive (no AWS call); the record's region in
 * region. */
static int record_has_live(const char *run_dir, char *region, size_t region_nbytes) {
    td_run_instances rec;
    if (td_run_instances_read(run_dir, &rec) != TD_OK) {
        td_error_clear();
        return 0;
    }
    int live = 0;
    for (size_t i = 0; i < rec.count; i++) live |= td_run_instance_live(&rec.items[i]);
    snprintf(region, region_nbytes, "%s", rec.region);
    td_run_instances_clear(&rec);
    return live;
}

/* With the run's lock taken: its instances terminated (lines to out), ids in ids. */
static td_status orphan_terminate(const char *run_dir, const char *run_id, const char *region,
                                  FILE *out, int *n, char *ids, size_t ids_nbytes) {
    td_aws_t *aws = NULL;
    TD_CHECK(new_client(region, &aws));
    char *project = project_of_run_dir(run_dir);
    td_status st =
        td__aws_terminate_run(aws, project, run_dir, run_id, END_ORPHAN, out, n, ids, ids_nbytes);
    free(project);
    td_aws_free(aws);
    return st;
}

td_status td__aws_cancel_orphan(const td_run *run, int *cancelled, char *buf, size_t nbytes) {
    *cancelled = 0;
    if (nbytes) buf[0] = '\0';
    char region[48] = "";
    if (!run || !run->run_dir || !record_has_live(run->run_dir, region, sizeof region))
        return TD_OK;
    int fd;
    if (lock_take(run->run_dir, &fd) != 1) return TD_OK; /* its supervisor lives: its job */
    char ids[1024] = "";
    int n = 0;
    td_status st = orphan_terminate(run->run_dir, run->id, region, NULL, &n, ids, sizeof ids);
    close(fd);
    if (st != TD_OK) {
        td_error(st,
                 "run %s's supervisor is gone and its instances may still be running (see "
                 "%s/%s): %s; run 'tandem gc', or terminate them in the EC2 console",
                 run->id, run->run_dir, td_run_path_name(TD_RUN_PATH_INSTANCES), td_error_msg());
        return st;
    }
    if (n > 0) {
        *cancelled = 1;
        snprintf(buf, nbytes, "terminated %d instance%s of run %s, whose supervisor was gone: %s",
                 n, n == 1 ? "" : "s", run->id, ids);
    }
    return TD_OK;
}

/* ---- tandem run / tandem ps: the cheap check ---- */
void td_gc_orphans(td_rundb *store, FILE *out, int *nterminated) {
    if (nterminated) *nterminated = 0;
    char *runs = td_xasprintf("%s/runs", td_rundb_dir(store));
    DIR *d = opendir(runs);
    for (struct dirent *de; d && (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        char *run_dir = td_xasprintf("%s/%s", runs, de->d_name);
        char region[48] = "";
        int fd;
        /* One open and parse per aws run, none otherwise; AWS only for an orphan. */
        if (record_has_live(run_dir, region, sizeof region) && lock_take(run_dir, &fd) == 1) {
            int n = 0;
            char ids[1024] = "";
            td_status st = orphan_terminate(run_dir, de->d_name, region, out, &n, ids, sizeof ids);
            close(fd);
            if (st != TD_OK) {
                fprintf(stderr,
                        "tandem: warning: run %s's supervisor is gone and %s/%s lists instances "
                        "still running, which could not be terminated: %s; run 'tandem gc', or "
                        "terminate them in the EC2 console\n",
                        de->d_name, run_dir, td_run_path_name(TD_RUN_PATH_INSTANCES),
                        td_error_msg());
                td_error_clear();
            }
            if (nterminated) *nterminated += n;
        }
        free(run_dir);
    }
    if (d) closedir(d);
    free(runs);
}

/* The instances of all from i on that belong where item i does: its run (tandem:run) or, with
 * controllers, the run it controls; in the same project. Each is marked in done. */
static td_ec2_instances take_group(const td_ec2_instances *all, int *done, int i,
                                   bool controllers) {
    const td_ec2_instance *first = &all->items[i];
    td_ec2_instances group = {0};
    for (int j = i; j < all->count; j++) {
        const td_ec2_instance *e = &all->items[j];
        if (done[j] || strcmp(controllers ? e->controller_of : e->run_id,
                              controllers ? first->controller_of : first->run_id) ||
            strcmp(e->project, first->project))
            continue;
        done[j] = 1;
        group.items = td_xrealloc(group.items, (size_t)(group.count + 1) * sizeof *group.items);
        group.items[group.count++] = *e;
    }
    return group;
}

/* Takes run_dir's lock without waiting, the fd into *fd (kept open, -1 when there is no lock
 * file): whether nobody else holds it. Unlike lock_take (the nodes' side) it creates no lock
 * file (none means nobody holds it) and does not pass over a detached run: a controller's run
 * is one. */
static int lock_run(const char *run_dir, int *fd) {
    char *lock = td_run_path(run_dir, TD_RUN_PATH_LOCK);
    *fd = open(lock, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    free(lock);
    return *fd < 0 || flock(*fd, LOCK_EX | LOCK_NB) == 0;
}

/* ---- tandem gc: the controllers of detached runs ----
 * A controller (tandem run -d, controller.c) is tagged tandem:controller=RUN, not tandem:run, and
 * its supervisor lives in the cloud: no lock here says whether it lives. Its run's store in S3
 * does (the tandem:store tag, else RUN/remote.json here): the run's record as the controller
 * pushed it (run/run.json) and the controller's own word (controller.json: which instance, when
 * it last spoke, until when it promised to speak again; written each time it feeds its
 * dead-man's switch, and at its end with a promise in the past). One is terminated when:
 *   - its run has ended (run.json final) and it was launched before that end (a controller
 *     launched later is a resume's, the next life of the run);
 *   - another controller of the run spoke after this one was launched (the run was resumed with
 *     a new controller: this one is an older life's, left behind);
 *   - it is the one that spoke, and its promise passed more than its orphan timeout and
 *     CTL_GC_GRACE_S ago: its supervisor went silent (or ended) and its switch, which fires at
 *     that promise, did not end it (the timeout once more: a live controller whose S3 writes
 *     fail a while still feeds its switch, and must not be taken for a dead one);
 *   - no store can be read for it and its run ended here (the run's status final, nobody holds
 *     its lock): a handoff that failed, a run resumed here since.
 * Otherwise it is left, saying why: a live controller is never touched. As for nodes, only this
 * project's, unless --all (then any whose store says so, never a live one). */
#define CTL_GC_GRACE_S 120.0 /* the switch checks every 2 s; a shutdown takes up to a minute */

/* A run record or a controller's word is a few KiB; a larger object under those keys was not
 * written by tandem and is not read (gc downloads it to /tmp, and parses it whole). */
#define STORE_JSON_MAX_BYTES (1 << 20)

/* A JSON object of the store (caller decrefs); NULL when absent or unreadable (*why says). */
static json_t *store_json(td_aws_t *aws, const char *bucket, const char *key, char *why,
                          size_t why_nbytes) {
    td_s3_object head = {0};
    td_status hs = td_s3_head(aws, bucket, key, &head);
    int64_t size = head.nbytes;
    td_s3_object_free(&head);
    if (hs != TD_OK) {
        snprintf(why, why_nbytes, "%s", hs == TD_ERR_NOTFOUND ? "absent" : td_error_msg());
        td_error_clear();
        return NULL;
    }
    if (size > STORE_JSON_MAX_BYTES) {
        snprintf(why, why_nbytes,
                 "s3://%s/%s is %lld bytes, more than the %d a run's record or a controller's "
                 "word can be; left unread (was it written by something other than tandem?)",
                 bucket, key, (long long)size, STORE_JSON_MAX_BYTES);
        return NULL;
    }
    char dir[] = "/tmp/tandem-gc-XXXXXX";
    if (!mkdtemp(dir)) {
        snprintf(why, why_nbytes, "no temporary directory: %s", strerror(errno));
        return NULL;
    }
    char *path = td_xasprintf("%s/obj.json", dir);
    json_t *j = NULL;
    td_status st = td_s3_get_file(aws, bucket, key, path, NULL);
    if (st == TD_OK) {
        json_error_t je;
        j = json_load_file(path, 0, &je);
        if (!j || !json_is_object(j)) {
            snprintf(why, why_nbytes, "s3://%s/%s is not a JSON object (%s)", bucket, key,
                     j ? "another type" : je.text);
            json_decref(j);
            j = NULL;
        }
    } else {
        snprintf(why, why_nbytes, "%s", st == TD_ERR_NOTFOUND ? "absent" : td_error_msg());
        td_error_clear();
    }
    unlink(path);
    rmdir(dir);
    free(path);
    return j;
}

/* What the store says of the run and its controllers. */
typedef struct {
    int read;            /* the store was reached */
    char why[512];       /* why not (read 0) */
    int ended;           /* run.json has a final status */
    char status[24];     /* run.json's */
    double ended_s;      /* run.json's end */
    char speaker[32];    /* controller.json's instance, "" when none */
    double heard_s, promise_s, orphan_s;
} store_view;

static void store_read(td_aws_t *aws, const char *store_url, store_view *v) {
    memset(v, 0, sizeof *v);
    td_s3_url u;
    if (td_s3_url_parse(store_url, &u) != TD_OK) {
        snprintf(v->why, sizeof v->why, "%s", td_error_msg());
        td_error_clear();
        return;
    }
    char *key = td_xasprintf("%s/run/%s", u.key, td_run_path_name(TD_RUN_PATH_RECORD));
    char why[512] = "";
    json_t *rj = store_json(aws, u.bucket, key, why, sizeof why);
    free(key);
    /* an absent run.json is a store not pushed yet (the run's supervisor has not started) */
    if (rj || !strcmp(why, "absent")) {
        v->read = 1;
        const char *status = rj ? json_string_value(json_object_get(rj, "status")) : NULL;
        td_run_status rs;
        if (status && td_run_status_parse(status, &rs) == TD_OK) {
            snprintf(v->status, sizeof v->status, "%s", status);
            v->ended = td_run_status_is_final(rs);
            v->ended_s = json_number_value(json_object_get(rj, "ended"));
        }
        td_error_clear();
        json_decref(rj);
        key = td_xasprintf("%s/%s", u.key, TD_CONTROLLER_WORD);
        json_t *cj = store_json(aws, u.bucket, key, why, sizeof why);
        free(key);
        const char *who = cj ? json_string_value(json_object_get(cj, "instance")) : NULL;
        if (who) {
            snprintf(v->speaker, sizeof v->speaker, "%s", who);
            v->heard_s = json_number_value(json_object_get(cj, "heard_s"));
            v->promise_s = json_number_value(json_object_get(cj, "promise_s"));
            v->orphan_s = json_number_value(json_object_get(cj, "orphan_timeout_s"));
        }
        json_decref(cj);
    } else {
        snprintf(v->why, sizeof v->why, "%s", why);
    }
    td_s3_url_free(&u);
}

static void fmt_utc(double t, char *out, size_t nbytes) {
    time_t s = (time_t)t;
    struct tm tm;
    gmtime_r(&s, &tm);
    strftime(out, nbytes, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* The verdict on one controller: 1 (terminate) or 0 (leave), why in why. */
static int ctl_verdict(const td_ec2_instance *e, const store_view *v, const char *store_url,
                       int local_ended, const char *local_status, double now, char *why,
                       size_t nbytes) {
    double launched = td__aws_parse_time(e->launch_time);
    char t1[32], t2[32];
    if (v->read && v->ended && (launched <= 0 || launched < v->ended_s)) {
        fmt_utc(v->ended_s, t1, sizeof t1);
        snprintf(why, nbytes, "its run ended (%s at %s, as its store %s/run/run.json says)",
                 v->status, t1, store_url);
        return 1;
    }
    if (v->read && v->speaker[0] && strcmp(v->speaker, e->id) && launched > 0 &&
        v->heard_s > launched) {
        fmt_utc(v->heard_s, t1, sizeof t1);
        snprintf(why, nbytes,
                 "the run has a newer controller, %s (heard at %s, after this one started): "
                 "this one is left from before a resume",
                 v->speaker, t1);
        return 1;
    }
    if (v->read && !strcmp(v->speaker, e->id) &&
        v->promise_s + v->orphan_s + CTL_GC_GRACE_S < now) {
        fmt_utc(v->heard_s, t1, sizeof t1);
        fmt_utc(v->promise_s, t2, sizeof t2);
        snprintf(why, nbytes,
                 "its dead-man's switch failed: its supervisor last spoke at %s and promised to "
                 "speak again by %s (%s/%s); it should have ended itself then",
                 t1, t2, store_url, TD_CONTROLLER_WORD);
        return 1;
    }
    if (!v->read && local_ended) {
        snprintf(why, nbytes, "its run ended here (%s) and nobody holds its lock%s%s", local_status,
                 store_url ? "; its store could not be read: " : "", store_url ? v->why : "");
        return 1;
    }
    if (v->read && !strcmp(v->speaker, e->id)) {
        fmt_utc(v->heard_s, t1, sizeof t1);
        fmt_utc(v->promise_s, t2, sizeof t2);
        snprintf(why, nbytes, "it is live: it last spoke at %s, promising to speak by %s", t1, t2);
    } else if (v->read) {
        snprintf(why, nbytes,
                 "it is starting: the run has not ended and no word of this controller is in "
                 "its store %s yet",
                 store_url);
    } else {
        snprintf(why, nbytes, "its run's store %s%s%s; its run has not ended here",
                 store_url ? store_url : "is unknown (no tandem:store tag, no RUN/remote.json)",
                 store_url ? " could not be read: " : "", store_url ? v->why : "");
    }
    printable(why);
    return 0;
}

/* The store's URL as RUN/remote.json names it (caller frees), or NULL. */
static char *remote_store_of(const char *run_dir) {
    if (!run_dir) return NULL;
    char *path = td_run_path(run_dir, TD_RUN_PATH_REMOTE);
    json_t *j = json_load_file(path, 0, NULL);
    free(path);
    const char *v = j ? json_string_value(json_object_get(j, "store")) : NULL;
    char *out = v ? td_xstrdup(v) : NULL;
    json_decref(j);
    return out;
}

static td_status gc_controllers(td_aws_t *aws, td_rundb *store, const td_gc_opts *o, FILE *out,
                                td_gc_counts *c) {
    static const char *const states[] = {"pending", "running", "stopping", "stopped"};
    td_ec2_instances all = {0};
    TD_CHECK(td_ec2_describe_tagged(aws, TD_EC2_TAG_CONTROLLER, states, 4, &all));
    const char *project = td_rundb_project_dir(store);
    int *done = td_xcalloc((size_t)all.count + 1, sizeof *done);
    double now = td_wall_s();
    int seen = 0, terminated = 0, left = 0, failed = 0;
    for (int i = 0; i < all.count; i++) {
        if (done[i]) continue;
        const td_ec2_instance *first = &all.items[i];
        td_ec2_instances group = take_group(&all, done, i, true);
        seen += group.count;
        const char *rid = first->controller_of;
        td_run known = {0};
        int in_store = td_run_find(store, rid, &known) == TD_OK && !strcmp(known.id, rid);
        td_error_clear();
        int ours = first->project[0] ? !strcmp(first->project, project) : in_store;
        char *run_dir = ours && in_store ? td_xstrdup(known.run_dir)
                                         : run_dir_of(first->project, rid);
        /* ended here: a final status in this project's store, and no group of it alive here
         * (an attached resume holds the lock) */
        int fd = -1, local_ended = 0, local_locked = 0; /* locked: no lock file, or it is ours */
        char local_status[24] = "";
        if (ours && in_store && td_run_status_is_final(known.status)) {
            snprintf(local_status, sizeof local_status, "%s", td_run_status_str(known.status));
            local_ended = local_locked = lock_run(known.run_dir, &fd);
        }
        td_run_clear(&known);
        char *store_url = NULL;
        for (int j = 0; j < group.count && !store_url; j++)
            if (group.items[j].store[0]) store_url = td_xstrdup(group.items[j].store);
        if (!store_url) store_url = remote_store_of(run_dir);
        store_view v = {0};
        if (store_url) store_read(aws, store_url, &v);
        else snprintf(v.why, sizeof v.why, "unknown");
        td_ec2_instance *kill_list = td_xcalloc((size_t)group.count, sizeof *kill_list);
        char(*kill_why)[1440] = td_xcalloc((size_t)group.count, sizeof *kill_why);
        int nkill = 0;
        for (int j = 0; j < group.count; j++) {
            const td_ec2_instance *e = &group.items[j];
            char why[1400], what[256];
            int verdict = ctl_verdict(e, &v, store_url, local_ended, local_status, now, why,
                                      sizeof why);
            describe(e, now, what, sizeof what);
            /* whose: as for nodes, another project's (or an unknown run's) only with --all */
            if (verdict && !ours && !o->all) {
                char rid_p[sizeof first->run_id];
                snprintf(rid_p, sizeof rid_p, "%s", rid);
                snprintf(why, sizeof why, "run %s of %s; 'tandem gc --all' terminates it",
                         printable(rid_p),
                         first->project[0] ? first->project : "an unknown project");
                verdict = 0;
                printable(why);
            }
            if (!verdict) {
                fprintf(out, "left %s (%s): %s\n", e->id, what, why);
                left++;
            } else if (o->dry_run) {
                fprintf(out, "would terminate %s (%s): %s\n", e->id, what, why);
                terminated++;
            } else {
                fprintf(out, "terminating %s (%s): %s\n", e->id, what, why);
                snprintf(kill_why[nkill], sizeof kill_why[nkill], "terminated by tandem gc: %s",
                         why);
                kill_list[nkill++] = *e;
            }
        }
        /* Each end goes into the run's record when it is here and its lock can be had, as a
         * node's does: a controller records itself only when it ends itself, so one ended by
         * gc would otherwise be missing from the run's instances and cost. */
        const char *rec_dir = NULL;
        if (nkill && run_dir) {
            if (fd < 0) local_locked = lock_run(run_dir, &fd);
            if (local_locked) rec_dir = run_dir;
            else
                TD_LOG_WARN("run %s is in use here (its lock is held): the ends of its controllers "
                            "terminated now are not recorded in its instances.json",
                            run_dir);
        }
        for (int j = 0; j < nkill; j++) {
            int n = 0;
            td_status ts = terminate_list(aws, &kill_list[j], 1, rec_dir, kill_why[j], out, &n,
                                          NULL, 0);
            if (n) { /* terminated; a record that could not be written is only a warning */
                if (ts != TD_OK) {
                    TD_LOG_WARN("%s", td_error_msg());
                    td_error_clear();
                }
                terminated += n;
                continue;
            }
            char rid_p[sizeof first->run_id];
            snprintf(rid_p, sizeof rid_p, "%s", rid);
            fprintf(out, "failed to terminate controller %s of run %s: %s\n", kill_list[j].id,
                    printable(rid_p), td_error_msg());
            td_error_clear();
            failed++;
        }
        free(kill_why);
        free(kill_list);
        free(store_url);
        if (fd >= 0) close(fd);
        free(run_dir);
        td_ec2_instances_free(&group);
    }
    free(done);
    if (all.count)
        fprintf(out, "%d controller%s tagged %s in %s: %d %s, %d left%s\n", seen,
                seen == 1 ? "" : "s", TD_EC2_TAG_CONTROLLER, td_aws_region(aws), terminated,
                o->dry_run ? "would be terminated" : "terminated", left,
                failed ? ", some failed (above)" : "");
    c->seen += seen;
    c->terminated += terminated;
    c->left += left;
    c->failed += failed;
    td_ec2_instances_free(&all);
    return TD_OK;
}

/* ---- tandem gc ---- */
typedef enum { GC_OURS, GC_LIVE, GC_UNKNOWN, GC_OTHER } gc_kind;

td_status td_gc_instances(td_rundb *store, const td_gc_opts *o, td_gc_counts *counts) {
    td_gc_counts c = {0};
    FILE *out = o->out ? o->out : stdout;
    char *region = NULL;
    if (o->region && *o->region)
        region = td_xstrdup(o->region);
    else
        TD_CHECK(td_aws_region_load(NULL, &region));
    td_aws_t *aws = NULL;
    td_ec2_instances all = {0};
    td_status st = new_client(region, &aws);
    static const char *const states[] = {"pending", "running", "stopping", "stopped"};
    if (st == TD_OK) st = td_ec2_describe_tandem(aws, states, 4, &all);
    if (st != TD_OK) goto out;
    const char *project = td_rundb_project_dir(store);
    if (all.count == 0)
        fprintf(out,
                "no instance tagged tandem:run is pending, running, stopping or stopped in %s\n",
                region);
    int *done = td_xcalloc((size_t)all.count + 1, sizeof *done);
    double now = td_wall_s();
    /* One run at a time: its lock taken once, its instances terminated in one call. */
    for (int i = 0; i < all.count; i++) {
        if (done[i]) continue;
        const td_ec2_instance *first = &all.items[i];
        td_ec2_instances group = take_group(&all, done, i, false);
        c.seen += group.count;
        /* Whose run: the tag's project, else (untagged) this project's when its store has it. */
        td_run known = {0};
        int in_store =
            td_run_find(store, first->run_id, &known) == TD_OK && !strcmp(known.id, first->run_id);
        td_error_clear();
        int ours = first->project[0] ? !strcmp(first->project, project) : in_store;
        char *run_dir = ours && in_store ? td_xstrdup(known.run_dir)
                                         : run_dir_of(first->project, first->run_id);
        td_run_clear(&known);
        gc_kind kind = ours ? (in_store ? GC_OURS : GC_UNKNOWN) : GC_OTHER;
        int fd = -1, locked = run_dir ? lock_take(run_dir, &fd) : -1;
        if (locked == 0) kind = GC_LIVE; /* a supervisor holds it (or another gc does) */
        char why[1400] = "";
        if (kind == GC_LIVE)
            snprintf(why, sizeof why, "run %s is live (its supervisor holds %s/lock)",
                     first->run_id, run_dir);
        else if (kind == GC_UNKNOWN)
            snprintf(why, sizeof why,
                     "run %s is not in this project's store (%s); 'tandem gc --all' terminates it",
                     first->run_id, td_rundb_dir(store));
        else if (kind == GC_OTHER)
            snprintf(why, sizeof why, "run %s of %s; 'tandem gc --all' terminates it",
                     first->run_id,
                     first->project[0] ? first->project
                                       : "an unknown project (no tandem:project tag, and not "
                                         "in this store)");
        printable(why);
        int terminate = kind == GC_OURS || (o->all && kind != GC_LIVE);
        if (!terminate || o->dry_run) {
            for (int j = 0; j < group.count; j++) {
                char what[256];
                describe(&group.items[j], now, what, sizeof what);
                if (terminate)
                    fprintf(out, "would terminate %s (%s)%s\n", group.items[j].id, what,
                            kind == GC_OURS ? ": its supervisor is gone" : "");
                else
                    fprintf(out, "left %s (%s): %s\n", group.items[j].id, what, why);
            }
            if (terminate)
                c.terminated += group.count; /* would be */
            else
                c.left += group.count;
        } else {
            int n = 0;
            td_status ts =
                terminate_list(aws, group.items, group.count, locked == 1 ? run_dir : NULL,
                               TD__AWS_END_GC, out, &n, NULL, 0);
            c.terminated += n;
            if (ts != TD_OK) {
                char rid[sizeof first->run_id];
                snprintf(rid, sizeof rid, "%s", first->run_id);
                fprintf(out, "failed to terminate %d instance%s of run %s: %s\n", group.count - n,
                        group.count - n == 1 ? "" : "s", printable(rid), td_error_msg());
                td_error_clear();
                c.failed += group.count - n;
            }
        }
        if (fd >= 0) close(fd);
        free(run_dir);
        td_ec2_instances_free(&group);
    }
    free(done);
    if (all.count)
        fprintf(out, "%d instance%s tagged tandem:run in %s: %d %s, %d left%s\n", c.seen,
                c.seen == 1 ? "" : "s", region, c.terminated,
                o->dry_run ? "would be terminated" : "terminated", c.left,
                c.failed ? ", some failed (above)" : "");
    /* the detached runs' controllers (tagged tandem:controller, not tandem:run) */
    st = gc_controllers(aws, store, o, out, &c);
    if (st != TD_OK) goto out;
    if (c.failed)
        st = td_error(TD_ERR_PEER, "tandem gc: %d instance%s could not be terminated (above)",
                      c.failed, c.failed == 1 ? "" : "s");
out:
    td_ec2_instances_free(&all);
    td_aws_free(aws);
    free(region);
    if (counts) *counts = c;
    return st;
}
