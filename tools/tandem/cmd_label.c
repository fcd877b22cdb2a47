/* tandem tag, tandem note, tandem group: the user's labels of a run, set after it started (tandem
 * run --tag/--group/--notes sets them at the start). They live in run.json and the index, as
 * every field of a run: the store rewrites both together. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "run_cli.h"

static const cli_opt no_opts[] = {{0}};

static const cli_command tag_verb = {
    .name = "tandem tag",
    .usage = "RUN [+]TAG... [-TAG]...",
    .about = "Adds tags to a run (TAG or +TAG) and removes them (-TAG); with no TAG, prints\n"
             "the run's tags. A tag is 1-64 characters of letters, digits and _ . - : / =,\n"
             "beginning with a letter, digit or _; a run has at most 32. tandem ps --tag T\n"
             "lists the runs that have it.\n",
    .opts = no_opts,
    .flags = CLI_STOP_AT_ARG, /* "-old" after RUN is a tag to remove, not an option */
};

int cmd_tag(int argc, char **argv) {
    cli_parser p;
    cli_init(&p, &tag_verb, argc, argv);
    for (int c; (c = cli_next(&p)) != CLI_END;)
        if (c == CLI_EXIT) return p.exit_code;
    if (p.next >= argc) return run_cli_usage_error(&tag_verb);
    const char *id = argv[p.next];
    const char **add = td_xcalloc((size_t)argc, sizeof *add);
    const char **del = td_xcalloc((size_t)argc, sizeof *del);
    size_t nadd = 0, ndel = 0;
    for (int i = p.next + 1; i < argc; i++) {
        if (argv[i][0] == '-')
            del[ndel++] = argv[i] + 1;
        else
            add[nadd++] = argv[i][0] == '+' ? argv[i] + 1 : argv[i];
    }
    td_rundb *store = NULL;
    td_run r = {0};
    int rc = run_cli_open_run(&tag_verb, id, &store, &r);
    if (rc) goto out_free;
    char *tags = NULL;
    /* The edit reads the tags inside the store's write transaction, not r.tags read above:
     * another `tandem tag` may have changed them since. */
    td_status st = nadd || ndel ? td_run_edit_tags(store, r.id, add, nadd, del, ndel, &tags)
                                : td_tags_edit(r.tags, NULL, 0, NULL, 0, &tags);
    if (st != TD_OK) {
        run_cli_error(st);
        rc = st == TD_ERR_INVALID || st == TD_ERR_NOTFOUND ? 2 : 1;
    } else {
        printf("%s tags: %s\n", run_cli_text(r.id), *tags ? tags : "(none)");
    }
    free(tags);
    run_cli_close(store, &r);
out_free:
    free(add);
    free(del);
    return rc;
}

static const cli_command note_verb = {
    .name = "tandem note",
    .usage = "RUN TEXT\nRUN -   (the text from stdin)",
    .about = "Sets the run's notes (free text, up to 64 KiB), replacing what it had; an empty\n"
             "TEXT ('') clears them. tandem show prints them; the run's own outcome note (why\n"
             "it ended as it did) is separate and stays.\n",
    .opts = no_opts,
};

int cmd_note(int argc, char **argv) {
    const char *id = NULL, *text = NULL;
    cli_parser p;
    cli_init(&p, &note_verb, argc, argv);
    for (int c; (c = cli_next(&p)) != CLI_END;) {
        if (c == CLI_EXIT) return p.exit_code;
        if (!id)
            id = p.value;
        else if (!text)
            text = p.value;
        else
            return cli_error(&note_verb, "one TEXT (quote it: tandem note %s 'several words')", id);
    }
    if (!id || !text) return run_cli_usage_error(&note_verb);
    char *owned = NULL;
    if (!strcmp(text, "-")) {
        size_t cap = 4096, len = 0, n;
        owned = td_xcalloc(cap, 1);
        while ((n = fread(owned + len, 1, cap - len - 1, stdin)) > 0) {
            len += n;
            if (len > TD_NOTES_MAX) break;
            if (cap - len < 2) owned = td_xrealloc(owned, cap *= 2);
        }
        owned[len] = '\0';
        while (len && owned[len - 1] == '\n') owned[--len] = '\0';
        text = owned;
    }
    td_rundb *store = NULL;
    td_run r = {0};
    int rc = run_cli_open_run(&note_verb, id, &store, &r);
    if (!rc) {
        td_status st = td_run_set_labels(store, r.id, NULL, NULL, text);
        if (st != TD_OK) {
            run_cli_error(st);
            rc = st == TD_ERR_INVALID ? 2 : 1;
        }
        run_cli_close(store, &r);
    }
    free(owned);
    return rc;
}

static const cli_command group_verb = {
    .name = "tandem group",
    .usage = "RUN GROUP\nRUN ''   (no group)",
    .about = "Puts the run in a group (one per run: a label that gathers runs, such as one\n"
             "sweep's), replacing its group; '' takes it out. GROUP follows the rules of a tag.\n"
             "tandem ps --group G lists a group's runs.\n",
    .opts = no_opts,
};

int cmd_group(int argc, char **argv) {
    const char *id = NULL, *group = NULL;
    cli_parser p;
    cli_init(&p, &group_verb, argc, argv);
    for (int c; (c = cli_next(&p)) != CLI_END;) {
        if (c == CLI_EXIT) return p.exit_code;
        if (!id)
            id = p.value;
        else if (!group)
            group = p.value;
        else
            return cli_error(&group_verb, "one GROUP per run ('%s' and '%s')", group, p.value);
    }
    if (!id || !group) return run_cli_usage_error(&group_verb);
    td_rundb *store = NULL;
    td_run r = {0};
    int rc = run_cli_open_run(&group_verb, id, &store, &r);
    if (rc) return rc;
    td_status st = td_run_set_labels(store, r.id, NULL, group, NULL);
    if (st != TD_OK) {
        run_cli_error(st);
        rc = st == TD_ERR_INVALID ? 2 : 1;
    }
    run_cli_close(store, &r);
    return rc;
}
