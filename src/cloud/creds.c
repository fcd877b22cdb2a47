/* Credentials and region, found as the AWS tools find them: the environment, the shared
 * credentials and config files, the instance role (IMDSv2). No secret reaches an error or log. */
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cloud/cloud_internal.h"

static const char *const env_names[] = {
#define TD__AWS_ENV_NAME(name, doc) #name,
    TD_AWS_ENV_MAP(TD__AWS_ENV_NAME)
#undef TD__AWS_ENV_NAME
};
static const char *const env_docs[] = {
#define TD__AWS_ENV_DOC(name, doc) doc,
    TD_AWS_ENV_MAP(TD__AWS_ENV_DOC)
#undef TD__AWS_ENV_DOC
};

const char *td_aws_env_name(td_aws_env var) {
    return (unsigned)var < TD_AWS_ENV_COUNT ? env_names[var] : "?";
}

const char *td_aws_env_get(td_aws_env var) {
    const char *v = getenv(td_aws_env_name(var));
    return v && *v ? v : NULL;
}

void td_aws_env_print(FILE *out) {
    for (int i = 0; i < TD_AWS_ENV_COUNT; i++) {
        /* never a secret's value */
        const char *v = td_aws_env_get((td_aws_env)i);
        int secret = i == TD_AWS_ENV_AWS_SECRET_ACCESS_KEY || i == TD_AWS_ENV_AWS_SESSION_TOKEN;
        fprintf(out, "%-34s %-20s %s\n", env_names[i], v ? (secret ? "(set)" : v) : "(unset)",
                env_docs[i]);
    }
}

/* ---- INI files (~/.aws/credentials, ~/.aws/config) ---- */

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    return s;
}

/* Calls fn for every key = value of section (exact text between the brackets, trimmed);
 * returns 1 when the section exists, 0 when not (or no file), -1 when unreadable. */
static int ini_scan(const char *path, const char *section,
                    int (*fn)(void *ud, const char *key, const char *value), void *ud) {
    FILE *f = fopen(path, "re");
    if (!f) return errno == ENOENT || errno == ENOTDIR ? 0 : -1;
    char *line = NULL;
    size_t cap = 0;
    int in = 0, found = 0;
    while (getline(&line, &cap, f) >= 0) {
        int indented = line[0] == ' ' || line[0] == '\t';
        char *s = trim(line);
        if (!*s || *s == '#' || *s == ';') continue;
        if (*s == '[') {
            char *end = strchr(s, ']');
            if (!end) continue;
            *end = '\0';
            in = !strcmp(trim(s + 1), section);
            found |= in;
            continue;
        }
        if (!in || indented) continue; /* a nested "s3 =" block's lines */
        char *eq = strchr(s, '=');
        if (!eq) continue;
        *eq = '\0';
        if (fn(ud, trim(s), trim(eq + 1))) break;
    }
    free(line);
    fclose(f);
    return found;
}

typedef struct {
    const char *key;
    char *value;
} ini_get_ud;

static int ini_get_fn(void *ud, const char *key, const char *value) {
    ini_get_ud *g = ud;
    if (strcmp(key, g->key)) return 0;
    free(g->value);
    g->value = td_xstrdup(value);
    return 0; /* the last one wins, as in Python's configparser... close enough */
}

int td__ini_get(const char *path, const char *section, const char *key, char **value_out) {
    ini_get_ud g = {key, NULL};
    *value_out = NULL;
    int r = ini_scan(path, section, ini_get_fn, &g);
    if (r < 0) return -1;
    if (!g.value) return 0;
    *value_out = g.value;
    return 1;
}

static int ini_none(void *ud, const char *key, const char *value) {
    (void)ud, (void)key, (void)value;
    return 0;
}

int td__ini_has_section(const char *path, const char *section) {
    return ini_scan(path, section, ini_none, NULL);
}

static char *aws_file(td_aws_env var, const char *def_name) {
    const char *v = td_aws_env_get(var);
    const char *home = getenv("HOME");
    if (v) {
        if (v[0] == '~' && v[1] == '/' && home) return td_xasprintf("%s%s", home, v + 1);
        return td_xstrdup(v);
    }
    return td_xasprintf("%s/.aws/%s", home ? home : "", def_name);
}

/* The config file names profile X "[profile X]" (and default "[default]"). */
static int config_section(const char *config, const char *profile, char *section, size_t cap) {
    if (!strcmp(profile, "default") && td__ini_has_section(config, "default") == 1) {
        snprintf(section, cap, "default");
        return 1;
    }
    snprintf(section, cap, "profile %s", profile);
    return td__ini_has_section(config, section);
}

static const char *profile_name(const char *profile, int *explicit_out) {
    *explicit_out = 1;
    if (profile && *profile) return profile;
    const char *env = td_aws_env_get(TD_AWS_ENV_AWS_PROFILE);
    if (env) return env;
    *explicit_out = 0;
    return "default";
}

static void creds_clear(td_aws_creds *c) {
    memset(c, 0, sizeof *c);
}

static void wipe_free(char *s) {
    if (!s) return;
    memset(s, 0, strlen(s));
    free(s);
}

void td_aws_creds_free(td_aws_creds *c) {
    if (!c) return;
    free(c->access_key_id);
    wipe_free(c->secret_access_key);
    wipe_free(c->session_token);
    creds_clear(c);
}

/* The names each source gives the three values, for messages: [0] key id, [1] secret, [2]
 * session token. */
static const char *const env_fields[] = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                         "AWS_SESSION_TOKEN"};
static const char *const file_fields[] = {"aws_access_key_id", "aws_secret_access_key",
                                          "aws_session_token"};
static const char *const imds_fields[] = {"AccessKeyId", "SecretAccessKey", "Token"};

/* The key id goes into the Authorization header and the token into x-amz-security-token: a
 * control character there (a CR/LF pasted in, a stray byte in a file) would split or corrupt
 * the signed request's headers. Refused, naming the source and the field, never the value. */
static td_status creds_check(const td_aws_creds *c, const char *const fields[3]) {
    const char *v[3] = {c->access_key_id, c->secret_access_key, c->session_token};
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; v[k] && v[k][i]; i++) {
            unsigned char ch = (unsigned char)v[k][i];
            if (ch >= 0x20 && ch != 0x7f) continue;
            return td_error(TD_ERR_INVALID,
                            "AWS credentials from %s: %s has a control character (byte 0x%02x "
                            "at position %zu of %zu; the value is not shown); credentials are "
                            "printable: set it again without it",
                            c->source, fields[k], ch, i, strlen(v[k]));
        }
    return TD_OK;
}

/* Keys of a profile in one file: 1 found, 0 not there, or an error status as -1 - st. */
static td_status profile_keys(const char *path, const char *section, const char *profile,
                              td_aws_creds *out, int *found) {
    *found = 0;
    if (td__ini_has_section(path, section) < 0)
        return td_error_errno(TD_ERR_IO, "cannot read the AWS file %s", path);
    char *id = NULL, *secret = NULL, *token = NULL;
    td__ini_get(path, section, "aws_access_key_id", &id);
    td__ini_get(path, section, "aws_secret_access_key", &secret);
    td__ini_get(path, section, "aws_session_token", &token);
    if (!id && !secret) {
        free(token);
        static const char *const unsupported[] = {"credential_process", "role_arn", "sso_start_url",
                                                  "sso_session", "web_identity_token_file"};
        for (size_t i = 0; i < TD_ARRAY_LEN(unsupported); i++) {
            char *v = NULL;
            if (td__ini_get(path, section, unsupported[i], &v) == 1) {
                free(v);
                return td_error(TD_ERR_UNSUPPORTED,
                                "AWS profile '%s' in %s gets its credentials through %s, which "
                                "tandem does not implement: export them first (eval \"$(aws "
                                "configure export-credentials --profile %s --format env)\")",
                                profile, path, unsupported[i], profile);
            }
        }
        return TD_OK;
    }
    if (!id || !secret || !*id || !*secret) {
        int has_id = id && *id;
        free(id);
        wipe_free(secret);
        wipe_free(token);
        return td_error(TD_ERR_INVALID,
                        "AWS profile '%s' in %s has %s but no %s: add it (aws configure "
                        "--profile %s)",
                        profile, path, has_id ? "aws_access_key_id" : "aws_secret_access_key",
                        has_id ? "aws_secret_access_key" : "aws_access_key_id", profile);
    }
    out->access_key_id = id;
    out->secret_access_key = secret;
    out->session_token = token && *token ? token : NULL;
    if (token && !*token) free(token);
    snprintf(out->source, sizeof out->source, "profile '%s' in %s", profile, path);
    *found = 1;
    return creds_check(out, file_fields);
}

td_status td_aws_creds_load(const char *profile_arg, td_aws_creds *out) {
    creds_clear(out);
    /* botocore's order: a profile named by the caller (aws.profile, the CLI's --profile) drops
     * the environment's keys from the chain; AWS_PROFILE alone does not. */
    bool named = profile_arg && *profile_arg;
    const char *id = named ? NULL : td_aws_env_get(TD_AWS_ENV_AWS_ACCESS_KEY_ID);
    const char *secret = named ? NULL : td_aws_env_get(TD_AWS_ENV_AWS_SECRET_ACCESS_KEY);
    if (id || secret) {
        if (!id || !secret)
            return td_error(TD_ERR_INVALID,
                            "%s is set but %s is not: set both (or unset both to use a profile "
                            "or the instance role)",
                            id ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
                            id ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
        out->access_key_id = td_xstrdup(id);
        out->secret_access_key = td_xstrdup(secret);
        const char *token = td_aws_env_get(TD_AWS_ENV_AWS_SESSION_TOKEN);
        out->session_token = token ? td_xstrdup(token) : NULL;
        snprintf(out->source, sizeof out->source, "environment (AWS_ACCESS_KEY_ID)");
        td_status st = creds_check(out, env_fields);
        if (st != TD_OK) td_aws_creds_free(out);
        return st;
    }
    int explicit_profile;
    const char *profile = profile_name(profile_arg, &explicit_profile);
    char *cred_file = aws_file(TD_AWS_ENV_AWS_SHARED_CREDENTIALS_FILE, "credentials");
    char *config = aws_file(TD_AWS_ENV_AWS_CONFIG_FILE, "config");
    td_status st = TD_OK;
    int found = 0;
    int in_creds = td__ini_has_section(cred_file, profile) == 1;
    char section[300];
    int in_config = config_section(config, profile, section, sizeof section) == 1;
    if (in_creds) st = profile_keys(cred_file, profile, profile, out, &found);
    if (st == TD_OK && !found && in_config)
        st = profile_keys(config, section, profile, out, &found);
    if (st != TD_OK || found) goto out;
    if (explicit_profile && !in_creds && !in_config) {
        st = td_error(TD_ERR_NOTFOUND,
                      "AWS profile '%s'%s is in neither %s nor %s: run `aws configure --profile "
                      "%s`, or name another profile",
                      profile, profile_arg && *profile_arg ? "" : " (from AWS_PROFILE)", cred_file,
                      config, profile);
        goto out;
    }
    const char *disabled = td_aws_env_get(TD_AWS_ENV_AWS_EC2_METADATA_DISABLED);
    if (disabled && !strcasecmp(disabled, "true")) {
        st = td_error(TD_ERR_NOTFOUND,
                      "no AWS credentials: AWS_ACCESS_KEY_ID is unset, profile '%s' has no keys "
                      "in %s or %s, and the instance role is off "
                      "(AWS_EC2_METADATA_DISABLED=true); set AWS_ACCESS_KEY_ID and "
                      "AWS_SECRET_ACCESS_KEY or run `aws configure`",
                      profile, cred_file, config);
        goto out;
    }
    st = td__imds_creds(out);
    if (st != TD_OK && st != TD_ERR_INVALID) { /* INVALID: it answered, with a bad value */
        char why[512];
        snprintf(why, sizeof why, "%s", td_error_msg());
        st = td_error(TD_ERR_NOTFOUND,
                      "no AWS credentials: AWS_ACCESS_KEY_ID is unset, profile '%s' has no keys "
                      "in %s or %s, and no instance role answered (%s); set AWS_ACCESS_KEY_ID "
                      "and AWS_SECRET_ACCESS_KEY, run `aws configure`, or attach an instance "
                      "profile to this machine",
                      profile, cred_file, config, why);
    }
out:
    free(cred_file);
    free(config);
    if (st != TD_OK) td_aws_creds_free(out);
    return st;
}

td_status td_aws_region_load(const char *profile_arg, char **region_out) {
    *region_out = NULL;
    const char *r = td_aws_env_get(TD_AWS_ENV_AWS_REGION);
    if (!r) r = td_aws_env_get(TD_AWS_ENV_AWS_DEFAULT_REGION);
    if (r) {
        *region_out = td_xstrdup(r);
        return TD_OK;
    }
    int explicit_profile;
    const char *profile = profile_name(profile_arg, &explicit_profile);
    char *config = aws_file(TD_AWS_ENV_AWS_CONFIG_FILE, "config");
    char section[300];
    td_status st = TD_OK;
    if (config_section(config, profile, section, sizeof section) == 1 &&
        td__ini_get(config, section, "region", region_out) == 1 && **region_out) {
        free(config);
        return TD_OK;
    }
    free(*region_out);
    *region_out = NULL;
    st = td_error(TD_ERR_NOTFOUND,
                  "no AWS region: AWS_REGION and AWS_DEFAULT_REGION are unset and profile '%s' "
                  "has no region in %s; export AWS_REGION=us-east-1 (or your region), or run "
                  "`aws configure set region REGION --profile %s`",
                  profile, config, profile);
    free(config);
    return st;
}

/* ---- the instance role, through the IMDSv2 client (imds.c) ---- */

static double parse_iso8601(const char *s) {
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *end = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!end) return 0;
    return (double)timegm(&tm);
}

td_status td__imds_creds(td_aws_creds *out) {
    creds_clear(out);
    td_imds_t *c = NULL;
    char *role = NULL, *doc = NULL, *path = NULL;
    json_t *j = NULL;
    int status = 0;
    td_status st = td_imds_new(NULL, &c);
    if (st != TD_OK) return st;
    const char *base = td_imds_endpoint(c);
    st = td_imds_get(c, "latest/meta-data/iam/security-credentials/", &role, &status);
    if (st != TD_OK) goto out;
    char *name = role; /* NULL: 404, no role */
    if (name) name[strcspn(name, "\r\n")] = '\0';
    if (!name || !*name) {
        st = td_error(TD_ERR_NOTFOUND,
                      "%s: the instance has no IAM role (attach an instance profile to it)", base);
        goto out;
    }
    path = td_xasprintf("latest/meta-data/iam/security-credentials/%s", name);
    st = td_imds_get(c, path, &doc, &status);
    if (st == TD_OK && !doc)
        st = td_error(TD_ERR_NOTFOUND, "%s/%s: HTTP 404 (the role's credentials are missing)", base,
                      path);
    if (st != TD_OK) goto out;
    j = json_loads(doc, 0, NULL);
    const char *code = j ? json_string_value(json_object_get(j, "Code")) : NULL;
    const char *id = j ? json_string_value(json_object_get(j, "AccessKeyId")) : NULL;
    const char *secret = j ? json_string_value(json_object_get(j, "SecretAccessKey")) : NULL;
    const char *tok = j ? json_string_value(json_object_get(j, "Token")) : NULL;
    const char *exp = j ? json_string_value(json_object_get(j, "Expiration")) : NULL;
    if (!id || !secret || (code && strcmp(code, "Success"))) {
        /* the document holds secrets: name its shape, never its text */
        st = td_error(TD_ERR_FORMAT,
                      "%s: the credentials of role '%s' are not a JSON object with Code "
                      "Success, AccessKeyId and SecretAccessKey (Code: %s)",
                      base, name, code ? code : "absent");
        goto out;
    }
    out->access_key_id = td_xstrdup(id);
    out->secret_access_key = td_xstrdup(secret);
    out->session_token = tok && *tok ? td_xstrdup(tok) : NULL;
    out->expires_wall_s = exp ? parse_iso8601(exp) : 0;
    snprintf(out->source, sizeof out->source, "instance role '%.100s' (IMDSv2 at %.100s)", name,
             base);
    st = creds_check(out, imds_fields);
    if (st != TD_OK) td_aws_creds_free(out);
out:
    if (j) json_decref(j);
    free(role);
    free(path);
    if (doc) wipe_free(doc);
    td_imds_free(c);
    return st;
}

/* ---- the regions ---- */
#define TD__AWS_REGIONS                                                                            \
    "us-east-1, us-east-2, us-west-1, us-west-2, af-south-1, ap-east-1, ap-east-2, ap-south-1, "   \
    "ap-south-2, ap-southeast-1, ap-southeast-2, ap-southeast-3, ap-southeast-4, "                 \
    "ap-southeast-5, ap-southeast-7, ap-northeast-1, ap-northeast-2, ap-northeast-3, "             \
    "ca-central-1, ca-west-1, eu-central-1, eu-central-2, eu-west-1, eu-west-2, eu-west-3, "       \
    "eu-south-1, eu-south-2, eu-north-1, il-central-1, me-south-1, me-central-1, mx-central-1, "   \
    "sa-east-1, us-gov-east-1, us-gov-west-1, cn-north-1, cn-northwest-1"

const char *td_aws_regions_list(void) {
    return TD__AWS_REGIONS;
}

int td_aws_region_known(const char *region) {
    size_t n = region ? strlen(region) : 0;
    if (!n) return 0;
    const char *all = TD__AWS_REGIONS;
    for (const char *p = all; (p = strstr(p, region)); p += n)
        if ((p == all || p[-1] == ' ') && (p[n] == ',' || p[n] == '\0')) return 1;
    return 0;
}
