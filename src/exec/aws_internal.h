/* Internals of executor aws shared by its files: the record of a run's instances
 * (RUN/instances.json, aws_record.c) and the orphan handling (aws_gc.c: tandem stop's
 * cancel_orphan, tandem gc, the check of tandem run/ps). The public reading side (the struct,
 * td_run_instances_read, the hours) is in tandem/exec.h; tests/executors/test_aws_record.c
 * checks these. */
#ifndef TANDEM_EXEC_AWS_INTERNAL_H
#define TANDEM_EXEC_AWS_INTERNAL_H

#include <stddef.h>
#include <stdio.h>

#include "tandem/cloud.h"
#include "tandem/exec.h"

/* The `end` texts tandem writes (free text may follow them in parentheses). */
#define TD__AWS_END_RUN_END "terminated by tandem at the end of the run"
#define TD__AWS_END_GC      "terminated by tandem gc"

/* ---- the record: RUN/instances.json ---- */
/* Writes r as run_dir/instances.json atomically (td_write_atomic): a reader sees the old record
 * or the new one. Times with 0.1 s precision, ended_s 0 as null, end "" or NULL as null. */
td_status td__aws_record_write(const char *run_dir, const td_run_instances *r);
/* The record as JSON text (caller frees), as td__aws_record_write writes it. */
char *td__aws_record_dump(const td_run_instances *r);
/* Parses the record's text; `path` names it in errors. */
td_status td__aws_record_parse(const char *text, const char *path, td_run_instances *out);
/* The entry of instance id, or NULL. */
td_run_instance *td__aws_record_find(td_run_instances *r, const char *id);
/* Adds in (a copy; its end is duplicated) or, when r has an entry with its id, replaces that
 * entry's fields with in's. Returns the entry. */
td_run_instance *td__aws_record_put(td_run_instances *r, const td_run_instance *in);
/* Marks the entry of id ended at ended_s with `end` and EC2's state (NULL: "terminated"):
 * 0, or -1 when r has no such entry. An entry that has ended already keeps its first end. */
int td__aws_record_end(td_run_instances *r, const char *id, double ended_s, const char *end,
                       const char *state);
/* Read-modify-write of run_dir's record (a missing one starts empty with provider "aws" and
 * region): each of the n instances put (td__aws_record_put), then written. For the supervisor
 * only, or with RUN/lock held: the record has one writer at a time. */
td_status td__aws_record_update(const char *run_dir, const char *region, const td_run_instance *in,
                                size_t n);

/* An instance as EC2 describes it, for the record: market from its lifecycle, node from its
 * tandem:node tag, launched_s from its launch time, no end. */
void td__aws_instance_from_ec2(const td_ec2_instance *e, td_run_instance *out);
/* A run's controller (tandem run -d) as its record holds it, however it ended (by itself,
 * controller.c, or by tandem gc): no node, at its on-demand price in region (prices: the
 * aws.prices file, NULL for tandem's table; unpriced when neither has the type), no end. */
void td__aws_controller_from_ec2(const td_ec2_instance *e, const char *region, const char *prices,
                                 td_run_instance *out);
/* EC2's launchTime ("2026-11-26T15:00:00.000Z") as epoch seconds; 0 when unreadable. */
double td__aws_parse_time(const char *iso8601);
/* "up 0.40 h" / "up 12.5 h" for a lifetime in seconds. */
void td__aws_fmt_lifetime(double s, char *out, size_t nbytes);

/* ---- orphans ---- */
/* Executor aws's cancel_orphan (td_executor.cancel_orphan): when nobody holds the run's lock
 * (its supervisor is gone) and its record lists an instance still alive, terminates every
 * instance tagged with the run (this project's) and those the record lists alive, records their
 * ends ("terminated by tandem gc (its supervisor was gone)"), and says so in buf
 * (*cancelled = 1). Does nothing (*cancelled = 0, no AWS call) when the lock is held or the
 * record lists nothing alive. Errors are the cloud layer's (credentials, region, a failed call),
 * wrapped with the run and the fix. */
td_status td__aws_cancel_orphan(const td_run *run, int *cancelled, char *buf, size_t nbytes);

/* The work of cancel_orphan once the caller decided (the supervisor's own end may call it too,
 * with end TD__AWS_END_RUN_END): terminates run_id's instances in aws that are this project's
 * (tandem:project tag equal to project_dir, or untagged and listed by the record) plus the
 * record's live ones, and records each end in run_dir's record (created if missing; run_dir
 * NULL: nothing recorded). One line per instance terminated to out (may be NULL); *nterminated
 * and the ids joined with ", " in ids (may be NULL). The caller holds the run's lock or is its
 * supervisor. */
td_status td__aws_terminate_run(td_aws_t *aws, const char *project_dir, const char *run_dir,
                                const char *run_id, const char *end, FILE *out, int *nterminated,
                                char *ids, size_t ids_nbytes);

/* ---- resources: (aws_choose.c) ---- */
/* uname -m of this tandem when it ships itself to the instances (no aws.tandem: the instances
 * need its architecture), in buf; NULL when aws.tandem names one on the image. */
const char *td__aws_ship_arch(const td_aws_options *o, char *buf, size_t nbytes);
/* The cheapest types of the region (up to 3, cheapest first: the rest are tried on capacity
 * refusals) that have what o->resources asks, of its architecture (resources.arch; ship_arch:
 * uname -m of a tandem that ships itself, NULL when aws.tandem names one on the image: a request
 * for another architecture is TD_ERR_INVALID, "any" is narrowed to it), priced as the run's cost
 * is (spot: EC2's spot price now in the type's cheapest zone that aws.zones allows; on demand:
 * aws.prices, tandem's table), the zones to try (*zones_out: spot, the chosen type's allowed
 * zones cheapest first; on demand, aws.zones as given; none: EC2 picks), and the choice in words
 * (*why_out, caller frees). None fits: TD_ERR_NOTFOUND naming the request and the closest
 * types. */
td_status td__aws_choose(td_aws_t *aws, const char *region, const td_aws_options *o, int spot,
                         const char *ship_arch, char ***types_out, size_t *ntypes_out,
                         char ***zones_out, size_t *nzones_out, char **why_out);
/* The zones where type may go (aws.zones, or every zone with a spot price), cheapest spot price
 * first (*zones_out, caller frees), the cheapest's price and its source ("spot price of ZONE at
 * WHEN"). TD_ERR_NOTFOUND when no allowed zone has a spot price for it. */
td_status td__aws_rank_zones(td_aws_t *aws, const char *type, const td_aws_options *o,
                             char ***zones_out, size_t *nzones_out, double *usd_out,
                             char *source, size_t source_nbytes);
/* The architecture instances must have: resources.arch (NULL: x86_64), "any" narrowed to the
 * shipped binary's (ship_arch: uname -m of a tandem that ships itself; NULL: aws.tandem names
 * one on the image); why (nbytes): words on a narrowing, "" otherwise. */
const char *td__aws_wanted_arch(const td_aws_options *o, const char *ship_arch, char *why,
                                size_t nbytes);
/* o->resources as YAML: "{cpu: 8, gpu: 1}". */
void td__aws_resources_text(const td_aws_options *o, char *out, size_t nbytes);

#endif
