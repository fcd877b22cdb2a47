/* The aws executor (executor: aws): the run's nodes on EC2 instances that it creates, one per
 * node, and terminates at the end, whatever the end. docs/cloud.md describes what it does; the
 * comments here say why.
 *
 * It is one more carrier of the one supervisor (supervisor.h), wrapped around the ssh carrier:
 * the instances are the ssh executor's hosts, found one by one (td__ssh_set_host), and the
 * agents, their links and stops are ssh's. What it adds:
 * - start: before each attempt, every node has a running instance that answers ssh, with the
 *   run's code on it. The first attempt creates them all; a later one replaces those that were
 *   interrupted or are gone (spot), keeping the others. Placement tries each instance type and
 *   subnet of the workflow in turn on a capacity refusal, spot first and on-demand after where
 *   `fallback: on-demand` says so, and repeats after a pause; any other refusal (credentials,
 *   key pair, image, instance type) ends it at once with AWS's words. The calls block (AWS, ssh),
 *   so the whole provisioning is one item of work on the supervisor's loop's threads
 *   (td_loop_queue_work, loop.h), whose after() starts the agents or ends the attempt, on the
 *   loop's thread; a stop meanwhile cancels it between two calls.
 * - an agent's `interrupted` note (its spot watch read IMDSv2's instance-action): the node is
 *   marked for replacement and the supervisor told (td__sup_node_interrupted): the workers
 *   checkpoint, and the next attempt resumes on a replacement.
 * - finish: the artifacts (ssh's), then every instance of the run terminated (by its tandem:run
 *   tag as well as by the record, so that an instance created by a request whose answer was lost
 *   goes too), and checked.
 * - the dead-man's switch (tandem/cloud.h): every instance is created with the watch in its user
 *   data and InstanceInitiatedShutdownBehavior=terminate, and a timer on the supervisor's loop
 *   tells every agent "alive N" (N: aws.orphan_timeout), so that an instance whose supervisor is
 *   gone (killed, its machine off, its network cut) ends itself.
 * Every instance is in RUN/instances.json (aws_record.c) from the moment RunInstances answers. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exec/aws_internal.h"
#include "exec/bundle.h"
#include "exec/supervisor.h"
#include "tandem/cloud.h"
#include "tandem/loop.h"

#define RUNNING_WAIT_S  600.0 /* RunInstances to "running" (GPU types can take minutes) */
#define SSH_WAIT_S      300.0 /* "running" to sshd answering and the code copied */
#define POLL_S          1.0
#define PLACE_ROUNDS    3   /* every type x subnet x market, then a pause, this many times */
#define PLACE_PAUSE_S   5.0 /* the first pause between rounds, doubled */
#define DEFAULT_USER    "ubuntu"
#define DEFAULT_ROOTDEV "/dev/sda1"
/* The switch's patience before the first word, and while a replacement is made (the other
 * nodes' agents are gone meanwhile): the waits of provision() below, and ssh.c's for a setup. */
#define SETUP_ALLOWANCE_S 3600.0

/* ---- options ---- */
static char **strv_copy(char *const *v, size_t n) {
    if (!n) return NULL;
    char **c = td_xcalloc(n, sizeof *c);
    for (size_t i = 0; i < n; i++) c[i] = td_xstrdup(v[i]);
    return c;
}

static void strv_free(char **v, size_t n) {
    for (size_t i = 0; v && i < n; i++) free(v[i]);
    free(v);
}

static char *dup_or_null(const char *s) {
    return s ? td_xstrdup(s) : NULL;
}

void td_aws_options_copy(td_aws_options *dst, const td_aws_options *src) {
    *dst = *src;
    dst->region = dup_or_null(src->region);
    dst->profile = dup_or_null(src->profile);
    dst->instance_types = strv_copy(src->instance_types, src->ninstance_types);
    dst->image = dup_or_null(src->image);
    dst->key_name = dup_or_null(src->key_name);
    dst->ssh_key = dup_or_null(src->ssh_key);
    dst->user = dup_or_null(src->user);
    dst->subnets = strv_copy(src->subnets, src->nsubnets);
    dst->security_groups = strv_copy(src->security_groups, src->nsecurity_groups);
    dst->max_price = dup_or_null(src->max_price);
    dst->root_device = dup_or_null(src->root_device);
    dst->iam_instance_profile = dup_or_null(src->iam_instance_profile);
    dst->prices = dup_or_null(src->prices);
    dst->controller_type = dup_or_null(src->controller_type);
    dst->controller_profile = dup_or_null(src->controller_profile);
    dst->resources.gpu_model = dup_or_null(src->resources.gpu_model);
    dst->resources.arch = dup_or_null(src->resources.arch);
    dst->zones = strv_copy(src->zones, src->nzones);
    dst->tags = src->ntags ? td_xcalloc(src->ntags, sizeof *dst->tags) : NULL;
    for (size_t i = 0; i < src->ntags; i++) {
        dst->tags[i].key = td_xstrdup(src->tags[i].key);
        dst->tags[i].value = td_xstrdup(src->tags[i].value);
    }
    dst->setup = strv_copy(src->setup, src->nsetup);
    dst->work_dir = dup_or_null(src->work_dir);
    dst->tandem = dup_or_null(src->tandem);
}

void td_aws_options_clear(td_aws_options *o) {
    free(o->region);
    free(o->profile);
    strv_free(o->instance_types, o->ninstance_types);
    free(o->image);
    free(o->key_name);
    free(o->ssh_key);
    free(o->user);
    strv_free(o->subnets, o->nsubnets);
    strv_free(o->security_groups, o->nsecurity_groups);
    free(o->max_price);
    free(o->root_device);
    free(o->iam_instance_profile);
    free(o->prices);
    free(o->controller_type);
    free(o->controller_profile);
    free(o->resources.gpu_model);
    free(o->resources.arch);
    strv_free(o->zones, o->nzones);
    for (size_t i = 0; i < o->ntags; i++) {
        free(o->tags[i].key);
        free(o->tags[i].value);
    }
    free(o->tags);
    strv_free(o->setup, o->nsetup);
    free(o->work_dir);
    free(o->tandem);
    memset(o, 0, sizeof *o);
}

/* ---- the carrier ---- */
typedef struct {
    char id[32];       /* the node's instance, "" none yet */
    char replaces[32]; /* the instance it replaced, "" none */
    char type[48], market[16], subnet[48], zone[48];
    double launched_s;
    double usd_per_hour; /* its price (0: unknown), and where it came from */
    char price_source[160];
    bool ready;       /* running, answering ssh, the code on it (td__ssh_set_host done) */
    bool interrupted; /* a notice came, or it is gone: replaced at the next start */
    char notice[200]; /* how it ended, for the record */
    int launches;     /* requests made for this node (the client token) */
} node_slot;

typedef struct {
    td__carrier base;
    const td_exec_job *job;
    const td_aws_options *o;
    td__ssh *ssh;
    td__carrier *inner; /* ssh's carrier */
    td__sup *sup;
    char region[48];
    node_slot *nodes;
    int n;

    /* the provisioning of an attempt's start, as work on the supervisor's loop's threads; the
     * slots are the work's own while it is queued or runs (the loop reads them only in its
     * after()) */
    bool provisioning, resume, stopping;
    atomic_int cancel;
    td_status prov_st;
    char prov_why[1536];

    /* the dead-man's switch */
    char *user_data;     /* every instance's (td_orphan_user_data) */
    double orphan_s;     /* aws.orphan_timeout */
    double alive_s;      /* what "alive N" promises now: orphan_s, or the replacement's grace */
    uint64_t alive_timer; /* on the supervisor's loop; 0 before the first start */

    /* tandem itself, shipped to every instance (bundle.h) unless aws.tandem names one there */
    bool ship;
    td__bundle bundle;
    char shipped_to[1024]; /* its path on the instances, once the first has it */
} aws_carrier;

/* How long an instance may hear nothing while the run is being (re)provisioned. */
static double provision_grace_s(const td_aws_options *o, double orphan_s) {
    return orphan_s + RUNNING_WAIT_S + SSH_WAIT_S + (o->nsetup ? SETUP_ALLOWANCE_S : 0);
}

/* A progress line, from the provisioning work too: stdio's lock keeps lines whole. */
static void say_line(aws_carrier *ac, const char *fmt, ...) TD_PRINTF(2, 3);
static void say_line(aws_carrier *ac, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char line[1024];
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    td__exec_say(ac->job->out, "%s", line);
}

static bool cancelled(aws_carrier *ac) {
    return atomic_load(&ac->cancel) != 0;
}

/* Sleeps up to s seconds, in short steps, so that a stop is not kept waiting. */
static bool nap(aws_carrier *ac, double s) {
    for (double t = 0; t < s && !cancelled(ac); t += 0.1) usleep(100000);
    return !cancelled(ac);
}

static void slot_record(aws_carrier *ac, const node_slot *sl, int node, double ended_s,
                        const char *end, const char *state) {
    td_run_instance in = {0};
    snprintf(in.id, sizeof in.id, "%s", sl->id);
    in.node = node;
    snprintf(in.type, sizeof in.type, "%s", sl->type);
    snprintf(in.market, sizeof in.market, "%s", sl->market);
    snprintf(in.subnet, sizeof in.subnet, "%s", sl->subnet);
    snprintf(in.zone, sizeof in.zone, "%s", sl->zone);
    in.launched_s = sl->launched_s;
    in.ended_s = ended_s;
    in.end = (char *)end;
    snprintf(in.replaces, sizeof in.replaces, "%s", sl->replaces);
    snprintf(in.state, sizeof in.state, "%s", state);
    in.usd_per_hour = sl->usd_per_hour;
    snprintf(in.price_source, sizeof in.price_source, "%s", sl->price_source);
    if (td__aws_record_update(ac->job->run->run_dir, ac->region, &in, 1) != TD_OK) {
        TD_LOG_WARN("the run's instance record: %s", td_error_msg());
        td_error_clear();
    }
}

/* One RunInstances for node i: the instance type, subnet and market given. */
static td_status launch_one(aws_carrier *ac, td_aws_t *aws, int i, const char *type,
                            const char *subnet, const char *zone, bool spot,
                            td_ec2_instance *out) {
    const td_aws_options *o = ac->o;
    node_slot *sl = &ac->nodes[i];
    char node_s[16], name[160];
    snprintf(node_s, sizeof node_s, "%d", i);
    snprintf(name, sizeof name, "tandem-%s-n%d", ac->job->run->id, i);
    size_t ntags = 3 + o->ntags;
    td_ec2_tag *tags = td_xcalloc(ntags, sizeof *tags);
    tags[0] = (td_ec2_tag){TD_EC2_TAG_PROJECT, ac->job->project_dir ? ac->job->project_dir : ""};
    tags[1] = (td_ec2_tag){TD_EC2_TAG_NODE, node_s};
    tags[2] = (td_ec2_tag){"Name", name};
    for (size_t k = 0; k < o->ntags; k++)
        tags[3 + k] = (td_ec2_tag){o->tags[k].key, o->tags[k].value};
    /* The client token makes a request that the client sends again (a lost answer) create one
     * instance, not two; each new request (another type, subnet or market, a replacement) has
     * its own. */
    char token_src[512], token[65];
    snprintf(token_src, sizeof token_src, "%s/%d/%d/%s/%s/%s/%d", ac->job->run->id, i,
             sl->launches, type, subnet ? subnet : "-", zone ? zone : "-", spot);
    td_aws_sha256_hex(token_src, strlen(token_src), token);
    token[40] = '\0';
    td_ec2_run_spec spec = {
        .image_id = o->image,
        .instance_type = type,
        .min_count = 1,
        .max_count = 1,
        .key_name = o->key_name,
        .subnet_id = subnet,
        .availability_zone = zone,
        .security_group_ids = (const char *const *)o->security_groups,
        .nsecurity_groups = (int)o->nsecurity_groups,
        .spot = spot,
        .spot_max_price = o->max_price,
        .iam_instance_profile = o->iam_instance_profile,
        .root_volume_gib = o->volume_gb,
        .root_device_name = o->root_device ? o->root_device : DEFAULT_ROOTDEV,
        .run_id = ac->job->run->id,
        .tags = tags,
        .ntags = (int)ntags,
        .client_token = token,
        .user_data = ac->user_data,
        .shutdown_terminates = 1,
    };
    td_ec2_instances got = {0};
    td_status st = td_ec2_run_instances(aws, &spec, &got);
    free(tags);
    if (st != TD_OK) return st;
    if (got.count < 1) {
        td_ec2_instances_free(&got);
        return td_error(TD_ERR_PEER, "EC2 RunInstances answered without an instance");
    }
    *out = got.items[0];
    td_ec2_instances_free(&got);
    return TD_OK;
}

/* Places node i: each instance type and subnet in turn on a capacity refusal, spot first (and
 * on-demand after, with fallback), for PLACE_ROUNDS rounds with a pause between them. */
static td_status place(aws_carrier *ac, td_aws_t *aws, int i, td_ec2_instance *out) {
    const td_aws_options *o = ac->o;
    node_slot *sl = &ac->nodes[i];
    td__buf tried = {0};
    td__buf_add(&tried, "", 0);
    int markets = o->spot ? (o->fallback_on_demand ? 2 : 1) : 1;
    /* subnets fix the zone; without them, the zones chosen (aws.zones, cheapest first) */
    size_t nsub = o->nsubnets ? o->nsubnets : o->nzones ? o->nzones : 1;
    double pause = PLACE_PAUSE_S;
    for (int round = 0; round < PLACE_ROUNDS; round++) {
        for (int m = 0; m < markets; m++) {
            bool spot = o->spot && m == 0;
            for (size_t t = 0; t < o->ninstance_types; t++)
                for (size_t k = 0; k < nsub; k++) {
                    if (cancelled(ac)) {
                        free(tried.s);
                        return td_error(TD_ERR_INTERRUPTED, "stopped while creating instances");
                    }
                    const char *subnet = o->nsubnets ? o->subnets[k] : NULL;
                    const char *zone = !o->nsubnets && o->nzones ? o->zones[k] : NULL;
                    const char *type = o->instance_types[t];
                    td_status st = launch_one(ac, aws, i, type, subnet, zone, spot, out);
                    sl->launches++;
                    if (st == TD_OK) {
                        snprintf(sl->type, sizeof sl->type, "%s", type);
                        snprintf(sl->market, sizeof sl->market, "%s", spot ? "spot" : "on-demand");
                        snprintf(sl->subnet, sizeof sl->subnet, "%s",
                                 out->subnet_id[0] ? out->subnet_id
                                 : subnet          ? subnet
                                                   : "");
                        snprintf(sl->zone, sizeof sl->zone, "%s", out->zone);
                        free(tried.s);
                        return TD_OK;
                    }
                    const td_aws_error *e = td_aws_last_error(aws);
                    if (!e->capacity) {
                        free(tried.s);
                        return st; /* the client's words: what is wrong and the fix */
                    }
                    const char *where = subnet ? subnet : zone ? zone : "the default subnet";
                    td__buf_addf(&tried, "%s%s %s in %s: %s", tried.len ? "; " : "", type,
                                 spot ? "spot" : "on-demand", where,
                                 e->code[0] ? e->code : "no capacity");
                    say_line(ac, "run %s: node %d: no %s %s capacity in %s (%s); trying the next",
                             ac->job->run->id, i, type, spot ? "spot" : "on-demand", where,
                             e->code);
                    td_error_clear();
                }
        }
        if (round + 1 < PLACE_ROUNDS) {
            say_line(ac,
                     "run %s: node %d: every placement refused for lack of capacity; trying "
                     "again in %.0f s",
                     ac->job->run->id, i, pause);
            if (!nap(ac, pause)) break;
            pause *= 2;
        }
    }
    td_status st =
        td_error(cancelled(ac) ? TD_ERR_INTERRUPTED : TD_ERR_PEER,
                 "no capacity for node %d after %d rounds: %.1200s; add instance types "
                 "(aws.instance_types) or subnets in other zones (aws.subnets)%s, or try later",
                 i, PLACE_ROUNDS, tried.s,
                 o->spot && !o->fallback_on_demand ? ", allow fallback: on-demand" : "");
    free(tried.s);
    return st;
}

/* Node i's price for what it got (its market, type and zone), for the cost in the record: spot
 * from EC2's spot price history of its zone, on demand from aws.prices or tandem's table. Not
 * knowing it is a warning, never a failure: the run goes on, its cost is then partial. */
static void price_slot(aws_carrier *ac, td_aws_t *aws, int i) {
    node_slot *sl = &ac->nodes[i];
    sl->usd_per_hour = 0;
    sl->price_source[0] = '\0';
    td_status st;
    if (!strcmp(sl->market, "spot")) {
        char when[48] = "";
        st = td_ec2_spot_price(aws, sl->type, sl->zone, &sl->usd_per_hour, when, sizeof when);
        if (st == TD_OK)
            snprintf(sl->price_source, sizeof sl->price_source, "spot price of %s at %s",
                     sl->zone, when);
    } else {
        st = td_aws_on_demand_price(ac->region, sl->type, ac->o->prices, &sl->usd_per_hour,
                                    sl->price_source, sizeof sl->price_source);
    }
    if (st != TD_OK) {
        say_line(ac, "run %s: node %d: WARNING: no price for %s %s in %s (%s); the run's cost "
                     "leaves this instance out",
                 ac->job->run->id, i, sl->type, sl->market, sl->zone, td_error_msg());
        td_error_clear();
        sl->usd_per_hour = 0;
    }
}

static const char *instance_addr(const aws_carrier *ac, const td_ec2_instance *e) {
    if (ac->o->public_address > 0 || (ac->o->public_address == 0 && e->public_ip[0]))
        return e->public_ip;
    return e->private_ip;
}

/* Waits until the instance runs; *e is its description then. */
static td_status wait_running(aws_carrier *ac, td_aws_t *aws, td_ec2_instance *e) {
    double deadline = td_now_s() + RUNNING_WAIT_S;
    for (;;) {
        if (cancelled(ac)) return td_error(TD_ERR_INTERRUPTED, "stopped while starting %s", e->id);
        const char *ids[] = {e->id};
        td_ec2_instances got = {0};
        td_status st = td_ec2_describe_instances(aws, ids, 1, NULL, NULL, &got);
        if (st == TD_OK && got.count == 1) {
            *e = got.items[0];
            td_ec2_instances_free(&got);
            if (!strcmp(e->state, "running") && instance_addr(ac, e)[0]) return TD_OK;
            if (strcmp(e->state, "pending") && strcmp(e->state, "running"))
                return td_error(TD_ERR_PEER, "instance %s is %s%s%s before it ran", e->id, e->state,
                                e->state_reason[0] ? ": " : "", e->state_reason);
        } else if (st == TD_OK) {
            td_ec2_instances_free(&got);
        } else {
            td_error_clear(); /* just created: EC2 may not know it yet (eventual consistency) */
        }
        if (td_now_s() > deadline)
            return td_error(TD_ERR_TIMEOUT, "instance %s did not run within %.0f s", e->id,
                            RUNNING_WAIT_S);
        nap(ac, POLL_S);
    }
}

/* tandem's bundle to node i's instance (entry: user@address): the instance checked (its arch,
 * its glibc), the bundle sent when it lacks it, and the ssh carrier told where tandem is there.
 * TD_ERR_PEER while the instance does not answer ssh yet. */
static td_status ship_tandem(aws_carrier *ac, int i, const char *entry, char *why, size_t nbytes) {
    node_slot *sl = &ac->nodes[i];
    char where[160], path[1024];
    snprintf(where, sizeof where, "instance %s (node %d, %s)", sl->id, i, sl->type);
    char **argv = td__ssh_command_for(ac->ssh, entry);
    int64_t sent = 0;
    double t0 = td_now_s();
    td_status st = td__bundle_ship(&ac->bundle, argv, where, path, sizeof path, &sent);
    for (char **p = argv; *p; p++) free(*p);
    free(argv);
    if (st != TD_OK) {
        snprintf(why, nbytes, "%s", td_error_msg());
        td_error_clear();
        return st;
    }
    /* one path for every node: the agents are started with one tandem */
    if (ac->shipped_to[0] && strcmp(ac->shipped_to, path)) {
        snprintf(why, nbytes,
                 "%.150s keeps tandem in %.300s but the other instances in %.300s: their "
                 "users' home directories differ; give every node the same aws.user and image",
                 where, path, ac->shipped_to);
        return TD_ERR_INVALID;
    }
    if (!ac->shipped_to[0]) {
        snprintf(ac->shipped_to, sizeof ac->shipped_to, "%s", path);
        td__ssh_set_tandem(ac->ssh, path);
    }
    if (sent)
        say_line(ac, "run %s: node %d: tandem shipped to %s in %.1f s (%.1f MB): %s",
                 ac->job->run->id, i, sl->id, td_now_s() - t0, (double)sent / 1e6, path);
    else
        say_line(ac, "run %s: node %d: %s has this tandem already (%s)", ac->job->run->id, i,
                 sl->id, path);
    return TD_OK;
}

/* Until the instance answers ssh and has the code (sshd starts some seconds after "running"). */
static td_status wait_ssh(aws_carrier *ac, int i, const char *addr, char *why, size_t nbytes) {
    const char *user = ac->o->user ? ac->o->user : DEFAULT_USER;
    char entry[160];
    snprintf(entry, sizeof entry, "%s@%s", user, addr);
    double deadline = td_now_s() + SSH_WAIT_S;
    for (;;) {
        if (cancelled(ac)) return TD_ERR_INTERRUPTED;
        td_status st = ac->ship ? ship_tandem(ac, i, entry, why, nbytes) : TD_OK;
        if (st == TD_OK)
            st = td__ssh_set_host(ac->ssh, i, entry, (const char *const *)ac->o->setup,
                                  ac->o->nsetup, why, nbytes);
        td_error_clear();
        if (st == TD_OK) return TD_OK;
        if (st != TD_ERR_PEER) return st; /* it answered: the copy or the setup failed */
        if (td_now_s() > deadline) return TD_ERR_TIMEOUT;
        nap(ac, 2.0);
    }
}

/* Marks the nodes whose instance is no longer running (gone without a notice: taken, or
 * terminated from outside) for replacement. */
static td_status check_alive(aws_carrier *ac, td_aws_t *aws) {
    for (int i = 0; i < ac->n; i++) {
        node_slot *sl = &ac->nodes[i];
        if (!sl->id[0] || sl->interrupted) continue;
        const char *ids[] = {sl->id};
        td_ec2_instances got = {0};
        TD_CHECK(td_ec2_describe_instances(aws, ids, 1, NULL, NULL, &got));
        if (got.count != 1 || strcmp(got.items[0].state, "running")) {
            snprintf(sl->notice, sizeof sl->notice, "lost (%s%s%.120s)",
                     got.count ? got.items[0].state : "no longer known to EC2",
                     got.count && got.items[0].state_reason[0] ? ": " : "",
                     got.count ? got.items[0].state_reason : "");
            sl->interrupted = true;
        }
        td_ec2_instances_free(&got);
    }
    return TD_OK;
}

/* The instances of nodes that have none, lost theirs or had it interrupted: the old one
 * terminated (it is going anyway: billing stops now), a new one created, running, answering ssh,
 * with the code. */
static td_status provision(aws_carrier *ac, td_aws_t *aws) {
    TD_CHECK(check_alive(ac, aws));
    for (int i = 0; i < ac->n; i++) {
        node_slot *sl = &ac->nodes[i];
        if (sl->id[0] && !sl->interrupted) continue;
        if (sl->id[0]) {
            const char *ids[] = {sl->id};
            if (td_ec2_terminate_instances(aws, ids, 1, NULL) != TD_OK) {
                TD_LOG_WARN("terminating the interrupted instance %s: %s", sl->id, td_error_msg());
                td_error_clear();
            }
            slot_record(ac, sl, i, td_wall_s(),
                        sl->notice[0] ? sl->notice : "interrupted (spot instance-action)",
                        "shutting-down");
            snprintf(sl->replaces, sizeof sl->replaces, "%s", sl->id);
            sl->id[0] = '\0';
        }
        sl->interrupted = false;
        sl->notice[0] = '\0';
        sl->ready = false;
        td_ec2_instance e;
        TD_CHECK(place(ac, aws, i, &e));
        snprintf(sl->id, sizeof sl->id, "%s", e.id);
        price_slot(ac, aws, i);
        sl->launched_s = td__aws_parse_time(e.launch_time);
        if (sl->launched_s <= 0) sl->launched_s = td_wall_s();
        slot_record(ac, sl, i, 0, NULL, e.state);
        say_line(ac, "run %s: node %d: instance %s (%s %s in %s)%s%s", ac->job->run->id, i, e.id,
                 sl->type, sl->market, sl->zone[0] ? sl->zone : "?",
                 sl->replaces[0] ? ", replacing " : "", sl->replaces);
    }
    /* each new one running and reachable */
    for (int i = 0; i < ac->n; i++) {
        node_slot *sl = &ac->nodes[i];
        if (sl->ready) continue;
        td_ec2_instance e = {0};
        snprintf(e.id, sizeof e.id, "%s", sl->id);
        TD_CHECK(wait_running(ac, aws, &e));
        slot_record(ac, sl, i, 0, NULL, "running");
        say_line(ac, "run %s: node %d: instance %s runs at %s; waiting for its ssh",
                 ac->job->run->id, i, sl->id, instance_addr(ac, &e));
        char why[1024] = "";
        td_status st = wait_ssh(ac, i, instance_addr(ac, &e), why, sizeof why);
        if (st == TD_ERR_INTERRUPTED) return td_error(st, "stopped");
        if (st != TD_OK && st != TD_ERR_TIMEOUT)
            return td_error(st, "instance %s (node %d): %s", sl->id, i, why);
        if (st != TD_OK)
            return td_error(TD_ERR_TIMEOUT,
                            "instance %s (node %d) runs but did not answer ssh within %.0f s: %s "
                            "(check aws.security_groups: ssh from this machine; aws.user, "
                            "aws.ssh_key)",
                            sl->id, i, SSH_WAIT_S, why);
        sl->ready = true;
    }
    return TD_OK;
}

/* The work: an attempt's instances, on a thread of the loop's. */
static void provision_work(void *user) {
    aws_carrier *ac = user;
    td_aws_opts ao = {.profile = ac->o->profile, .region = ac->region};
    td_aws_t *aws = NULL;
    td_status st = td_aws_new(&ao, &aws);
    if (st == TD_OK) st = provision(ac, aws);
    ac->prov_st = st;
    if (st != TD_OK) snprintf(ac->prov_why, sizeof ac->prov_why, "%s", td_error_msg());
    td_error_clear();
    td_aws_free(aws);
}

/* Its after(), on the supervisor's loop: the attempt's agents, or how it ended. */
static void provisioned(td_loop *l, void *user) {
    (void)l;
    aws_carrier *ac = user;
    ac->provisioning = false;
    td__sup_exit e = {.code = 1, .worker_code = -1};
    if (ac->stopping || ac->prov_st == TD_ERR_INTERRUPTED) {
        e.code = -1; /* stopped before anything ran */
        td__sup_attempt_over(ac->sup, &e);
        return;
    }
    if (ac->prov_st != TD_OK) {
        snprintf(e.cause, sizeof e.cause, "executor aws: %.1000s", ac->prov_why);
        td__sup_attempt_over(ac->sup, &e);
        return;
    }
    ac->alive_s = ac->orphan_s; /* every node has its agent again */
    if (ac->inner->ops->start(ac->inner, ac->sup, ac->resume) != TD_OK) {
        snprintf(e.cause, sizeof e.cause, "cannot start the nodes' agents: %.900s", td_error_msg());
        td_error_clear();
        td__sup_attempt_over(ac->sup, &e);
    }
}

/* The heartbeat: every running agent hears that its supervisor lives (and for how long it
 * promises to). Only a few bytes on each ssh connection, whatever the job prints. */
static void send_alive(td_loop *l, void *user) {
    (void)l;
    aws_carrier *ac = user;
    char line[48];
    snprintf(line, sizeof line, "alive %.0f\n", ac->alive_s);
    td__ssh_tell_agents(ac->ssh, line);
}

static td_status aws_start(td__carrier *base, td__sup *sup, bool resume) {
    aws_carrier *ac = (aws_carrier *)base;
    if (!ac->alive_timer) {
        double p = td_orphan_heartbeat_s(ac->orphan_s);
        ac->alive_timer = td_loop_timer(td__sup_loop(sup), p, p, send_alive, ac);
    }
    ac->sup = sup;
    ac->resume = resume;
    ac->stopping = false;
    atomic_store(&ac->cancel, 0);
    ac->prov_st = TD_OK;
    ac->prov_why[0] = '\0';
    if (!td_loop_queue_work(td__sup_loop(sup), provision_work, provisioned, ac))
        return td_error(TD_ERR_SYS, "cannot start the work that creates the instances: %s",
                        td_error_msg());
    ac->provisioning = true;
    return TD_OK;
}

static void aws_stop(td__carrier *base, bool hard) {
    aws_carrier *ac = (aws_carrier *)base;
    if (ac->provisioning) { /* nothing runs yet: the work ends at its next step */
        ac->stopping = true;
        atomic_store(&ac->cancel, 1);
        return;
    }
    ac->inner->ops->stop(ac->inner, hard);
}

/* What an agent's spot watch says (src/launch/spot_watch.c). */
static void on_agent_note(void *user, int node, const char *key, const char *value) {
    aws_carrier *ac = user;
    if (node < 0 || node >= ac->n || ac->provisioning) return;
    node_slot *sl = &ac->nodes[node];
    if (!strcmp(key, "interrupted")) {
        if (sl->interrupted) return;
        sl->interrupted = true;
        snprintf(sl->notice, sizeof sl->notice, "interrupted (spot instance-action %.120s)", value);
        char why[320];
        snprintf(why, sizeof why, "spot interruption notice for instance %s (%.120s)", sl->id,
                 value);
        TD_LOG_INFO("node %d: %s", node, why);
        /* the others wait for the replacement, their agents gone meanwhile */
        ac->alive_s = provision_grace_s(ac->o, ac->orphan_s);
        send_alive(NULL, ac);
        td__sup_node_interrupted(ac->sup, node, why);
    } else if (!strcmp(key, "rebalance")) {
        td__sup_say(ac->sup,
                    "run %s: node %d: EC2 recommends rebalancing instance %s (noticed %.60s): it "
                    "is at higher risk of an interruption",
                    ac->job->run->id, node, sl->id, value);
    }
}

/* Every instance of the run terminated, on every outcome, then checked: none may keep billing. */
static void terminate_all(aws_carrier *ac) {
    td_aws_opts ao = {.profile = ac->o->profile, .region = ac->region};
    td_aws_t *aws = NULL;
    int n = 0;
    char ids[1024] = "";
    td_status st = td_aws_new(&ao, &aws);
    if (st == TD_OK)
        st =
            td__aws_terminate_run(aws, ac->job->project_dir, ac->job->run->run_dir,
                                  ac->job->run->id, TD__AWS_END_RUN_END, NULL, &n, ids, sizeof ids);
    if (st == TD_OK) { /* checked, not trusted: EC2 is asked what is still alive */
        const char *live[] = {"pending", "running", "stopping", "stopped"};
        td_ec2_instances got = {0};
        int left = 0;
        st = td_ec2_describe_instances(aws, NULL, 0, ac->job->run->id, NULL, &got);
        for (int i = 0; st == TD_OK && i < got.count; i++)
            for (size_t k = 0; k < TD_ARRAY_LEN(live); k++)
                if (!strcmp(got.items[i].state, live[k])) left++;
        if (st == TD_OK && left)
            st = td_error(TD_ERR_PEER, "%d instance%s of the run still not shutting down", left,
                          left > 1 ? "s" : "");
        td_ec2_instances_free(&got);
    }
    if (st == TD_OK) {
        if (n)
            say_line(ac, "run %s: terminated %d instance%s (%s)", ac->job->run->id, n,
                     n > 1 ? "s" : "", ids);
    } else {
        say_line(ac,
                 "run %s: WARNING: could not terminate every instance of the run: %s; they may "
                 "keep billing: run tandem gc (or terminate the instances tagged tandem:run=%s)",
                 ac->job->run->id, td_error_msg(), ac->job->run->id);
        td_error_clear();
    }
    td_aws_free(aws);
}

static void aws_finish(td__carrier *base) {
    aws_carrier *ac = (aws_carrier *)base;
    /* No provisioning is left: the supervisor's loop is gone (td__supervise frees it before
     * this), and it ends only once an attempt has ended, which an attempt that provisions does
     * in provisioned() above. (Were one left, td_loop_free would have waited for it; a stop
     * sets cancel first, so it returns between two calls.) */
    ac->provisioning = false;
    /* node 0 writes what a run saves; a node never set up has no host to ask */
    if (ac->n && ac->nodes[0].ready && ac->inner->ops->finish) ac->inner->ops->finish(ac->inner);
    terminate_all(ac);
}

static void aws_before_say(td__carrier *base) {
    aws_carrier *ac = (aws_carrier *)base;
    if (ac->inner->ops->before_say) ac->inner->ops->before_say(ac->inner);
}

static const td__carrier_ops aws_ops = {
    .name = "aws",
    .start = aws_start,
    .stop = aws_stop,
    .finish = aws_finish,
    .before_say = aws_before_say,
};

/* ---- the run ---- */
/* How the nodes are reached: ssh with the key pair's private key; a new instance's host key is
 * not known beforehand (it was made seconds ago, for us), so it is accepted and not kept: the
 * next instance at the same address has another one (SkyPilot does the same). */
static void ssh_options_for(const td_aws_options *o, td_ssh_options *so) {
    memset(so, 0, sizeof *so);
    const char *args[] = {"-o", "StrictHostKeyChecking=no",
                          "-o", "UserKnownHostsFile=/dev/null",
                          "-o", "LogLevel=ERROR"};
    size_t n = TD_ARRAY_LEN(args) + (o->ssh_key ? 2 : 0);
    so->ssh_args = td_xcalloc(n, sizeof *so->ssh_args);
    for (size_t i = 0; i < TD_ARRAY_LEN(args); i++)
        so->ssh_args[so->nssh_args++] = td_xstrdup(args[i]);
    if (o->ssh_key) {
        so->ssh_args[so->nssh_args++] = td_xstrdup("-i");
        so->ssh_args[so->nssh_args++] = td_xstrdup(o->ssh_key);
    }
    so->work_dir = dup_or_null(o->work_dir);
    so->tandem = dup_or_null(o->tandem);
}

/* The workers' environment, plus the agents' spot watch (src/launch/spot_watch.c) and the
 * run's region, which an S3 client on the node needs and its image need not be configured with
 * (it is no secret). */
static char **env_for_nodes(char *const *env, const char *region, char **region_var) {
    size_t n = 0;
    while (env && env[n]) n++;
    char **v = td_xcalloc(n + 4, sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = env[i];
    v[n++] = (char *)"TANDEM_SPOT_WATCH=1";
    v[n++] = (char *)"TANDEM_ORPHAN_HEARD=" TD_ORPHAN_HEARD_PATH;
    *region_var = td_xasprintf("AWS_REGION=%s", region);
    v[n++] = *region_var;
    return v;
}

/* Credentials and region, and an account that answers: a clear error, and nothing created, when
 * they are wrong. */
static td_status check_account(const td_exec_job *job, char *region, size_t nbytes) {
    const td_aws_options *o = job->aws;
    td_aws_opts ao = {.profile = o->profile, .region = o->region};
    td_aws_t *aws = NULL;
    TD_CHECK(td_aws_new(&ao, &aws));
    snprintf(region, nbytes, "%s", td_aws_region(aws));
    td_ec2_instances none = {0}; /* DescribeInstances of the run's tag: cheap, read-only */
    td_status st = td_ec2_describe_instances(aws, NULL, 0, job->run->id, NULL, &none);
    td_ec2_instances_free(&none);
    td_aws_free(aws);
    if (st != TD_OK && !td_aws_region_known(region)) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", td_error_msg());
        st = td_error(st,
                      "region '%s' is not an AWS region (set aws.region, AWS_REGION or "
                      "AWS_DEFAULT_REGION to one of: %s): %s",
                      region, td_aws_regions_list(), msg);
    }
    return st;
}


/* o->resources: o->instance_types become the cheapest that fit (aws_choose.c), o->zones the
 * zones to try (spot: cheapest first), and the root volume the disk asked for; the choice is
 * said. */
static td_status choose_types(td_aws_options *o, const char *region, const td_exec_job *job) {
    td_aws_opts ao = {.profile = o->profile, .region = region};
    td_aws_t *aws = NULL;
    TD_CHECK(td_aws_new(&ao, &aws));
    char **types = NULL, **zones = NULL, *why = NULL, arch[64];
    size_t n = 0, nz = 0;
    td_status st = td__aws_choose(aws, region, o, o->spot, td__aws_ship_arch(o, arch, sizeof arch),
                                  &types, &n, &zones, &nz, &why);
    td_aws_free(aws);
    TD_CHECK(st);
    strv_free(o->instance_types, o->ninstance_types);
    o->instance_types = types;
    o->ninstance_types = n;
    strv_free(o->zones, o->nzones);
    o->zones = zones;
    o->nzones = nz;
    if (!o->volume_gb && o->resources.disk_gib) o->volume_gb = o->resources.disk_gib;
    td__exec_say(job->out, "run %s: %s", job->run->id, why);
    free(why);
    return TD_OK;
}

/* Without aws.tandem (a tandem the image has), this tandem goes to every instance: its bundle,
 * made or found in the cache now, so that a failure to make it ends the run before anything is
 * created. */
static td_status prepare_shipping(aws_carrier *ac) {
    const td_exec_job *job = ac->job;
    ac->ship = !ac->o->tandem;
    if (!ac->ship) return TD_OK;
    double t0 = td_now_s();
    TD_CHECK(td__bundle_get(&ac->bundle));
    td__exec_say(job->out,
                 "run %s: tandem ships to the instances: bundle %s (%s %s, glibc >= %s; %.1f MB: "
                 "the binary, %zu libraries%s) in %.1f s",
                 job->run->id, ac->bundle.key, ac->bundle.os, ac->bundle.arch,
                 ac->bundle.glibc_needed, (double)ac->bundle.nbytes / 1e6, ac->bundle.nlibs,
                 ac->bundle.has_sdk ? ", the Python SDK" : "; no Python SDK beside this tandem",
                 td_now_s() - t0);
    return TD_OK;
}

/* aws.zones without resources: for spot instances of a named type (and no subnets, which fix the
 * zone), the allowed zones cheapest first (spot prices differ from zone to zone); said. */
static td_status choose_zones(td_aws_options *o, const char *region, const td_exec_job *job) {
    td_aws_opts ao = {.profile = o->profile, .region = region};
    td_aws_t *aws = NULL;
    TD_CHECK(td_aws_new(&ao, &aws));
    char **zones = NULL, source[200];
    size_t nz = 0;
    double usd = 0;
    td_status st = td__aws_rank_zones(aws, o->instance_types[0], o, &zones, &nz, &usd, source,
                                      sizeof source);
    td_aws_free(aws);
    TD_CHECK(st);
    strv_free(o->zones, o->nzones);
    o->zones = zones;
    o->nzones = nz;
    td__buf b = {0};
    for (size_t z = 0; z < nz; z++) td__buf_addf(&b, " %s", zones[z]);
    td__exec_say(job->out, "run %s: %s spot is cheapest in %s: $%.5f/h (%s); zones in turn:%s",
                 job->run->id, o->instance_types[0], zones[0], usd, source, b.s);
    free(b.s);
    return TD_OK;
}

static int aws_run(const td_exec_job *job) {
    const td_run *run = job->run;
    const td_aws_options *o = job->aws;
    double t0 = td_now_s();
    if (o->ssh_key && access(o->ssh_key, R_OK) != 0)
        return td__exec_fail(job, t0,
                             "executor aws: aws.ssh_key %s cannot be read (%s); give the private "
                             "key of the key pair '%s'",
                             o->ssh_key, strerror(errno), o->key_name);
    aws_carrier ac = {.base = {&aws_ops}, .job = job, .o = o, .n = run->nodes};
    ac.orphan_s = o->orphan_timeout_s > 0 ? o->orphan_timeout_s : TD_AWS_ORPHAN_TIMEOUT_S;
    ac.alive_s = ac.orphan_s;
    if (check_account(job, ac.region, sizeof ac.region) != TD_OK) {
        int cli = td__exec_fail(job, t0, "executor aws: %s", td_error_msg());
        td_error_clear();
        return cli;
    }
    /* resources: the types are chosen now, from the region's catalog and prices */
    td_aws_options chosen = {0};
    if (o->resources.set || (o->spot && o->nzones && !o->nsubnets)) {
        td_aws_options_copy(&chosen, o);
        if ((o->resources.set ? choose_types : choose_zones)(&chosen, ac.region, job) != TD_OK) {
            int cli = td__exec_fail(job, t0, "executor aws: %s", td_error_msg());
            td_error_clear();
            td_aws_options_clear(&chosen);
            return cli;
        }
        ac.o = o = &chosen;
    }
    char *region_var = NULL;
    char **env = env_for_nodes(job->env, ac.region, &region_var);
    td_exec_job j = *job;
    j.env = env;
    td_ssh_options so;
    ssh_options_for(o, &so);
    int cli = 1;
    td_status st = td__ssh_new(&j, &so, run->nodes, &ac.ssh);
    td_ssh_options_clear(&so);
    if (st != TD_OK) {
        cli = td__exec_fail(job, t0, "executor aws: %s", td_error_msg());
        td_error_clear();
        free(env);
        free(region_var);
        td_aws_options_clear(&chosen);
        return cli;
    }
    td__ssh_on_note(ac.ssh, on_agent_note, &ac);
    if (prepare_shipping(&ac) != TD_OK) {
        cli = td__exec_fail(job, t0, "executor aws: %s", td_error_msg());
        td_error_clear();
        goto out;
    }
    ac.user_data = td_orphan_user_data(ac.orphan_s, provision_grace_s(o, ac.orphan_s), NULL);
    ac.inner = td__ssh_carrier(ac.ssh);
    ac.nodes = td_xcalloc((size_t)run->nodes, sizeof *ac.nodes);
    char note[512];
    snprintf(note, sizeof note, "on %d aws instance%s (%s%s, %s)", run->nodes,
             run->nodes > 1 ? "s" : "", o->instance_types[0], o->spot ? " spot" : "", ac.region);
    td__exec_say(job->out, "run %s: %d %s%s instance%s in %s, %d worker%s each", run->id,
                 run->nodes, o->instance_types[0], o->spot ? " spot" : "",
                 run->nodes > 1 ? "s" : "", ac.region, run->nproc_per_node,
                 run->nproc_per_node > 1 ? "s" : "");
    st = td_run_set_status(job->store, run->id, TD_RUN_RUNNING, -1, note);
    if (st != TD_OK) {
        cli = td__exec_fail(job, t0, "supervisor error: %s", td_error_msg());
        td_error_clear();
        goto out;
    }
    /* The agents run their workers with --max-restarts 0: the supervisor restarts the group
     * (after a failure, max_restarts; after an interruption, on a replacement). */
    cli = td__supervise(job, &ac.base, job->max_restarts, TD__SSH_CUT_AFTER_S, note, t0);
out:
    free(ac.nodes);
    free(ac.user_data);
    td__bundle_clear(&ac.bundle);
    td__ssh_free(ac.ssh);
    free(env);
    free(region_var);
    td_aws_options_clear(&chosen);
    return cli;
}

static char *aws_describe(const td_run *run) {
    td_run_instances r = {0};
    if (td_run_instances_read(run->run_dir, &r) != TD_OK) {
        td_error_clear();
        return NULL;
    }
    td__buf b = {0};
    size_t unpriced = 0;
    double cost = td_run_instances_cost(&r, td_wall_s(), &unpriced);
    td__buf_addf(&b, "aws: %zu instance%s in %s, %.2f instance-hours", r.count,
                 r.count == 1 ? "" : "s", r.region, td_run_instances_hours(&r, td_wall_s()));
    if (unpriced < r.count)
        td__buf_addf(&b, ", $%.4f%s", cost, unpriced ? " (some unpriced)" : "");
    td_run_instances_clear(&r);
    return b.s;
}

const td_executor td__executor_aws = {
    .name = "aws",
    .run = aws_run,
    .cancel_orphan = td__aws_cancel_orphan,
    .describe = aws_describe,
};
