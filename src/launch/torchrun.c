/* torchrun's flags that need more than a field of the options: the streams spec of --redirects
 * and --tee, the GPU count behind --nproc-per-node gpu/auto, and the Python a worker script runs
 * with (torchrun uses its own sys.executable; tandem is no Python program, so it says which). */
#include "launch_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool is_executable_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

char *td__which(const char *cmd) {
    if (strchr(cmd, '/')) return is_executable_file(cmd) ? td_xstrdup(cmd) : NULL;
    const char *env_path = getenv("PATH");
    char *dirs = td_xstrdup(env_path && *env_path ? env_path : "/usr/local/bin:/usr/bin:/bin");
    char *found = NULL, *save = NULL;
    for (char *d = strtok_r(dirs, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
        char *cand = td_xasprintf("%s/%s", *d ? d : ".", cmd);
        if (is_executable_file(cand))
            found = cand;
        else
            free(cand);
    }
    free(dirs);
    return found;
}

/* A whole decimal number without sign (torchrun's \d); -1 otherwise. */
static long parse_digits(const char *s, size_t n) {
    if (n == 0 || n > 9) return -1;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

td_status td_launch_std_parse(const char *spec, int local_rank, int *out) {
    *out = 0;
    if (!spec) return TD_OK;
    if (spec[0] >= '0' && spec[0] <= '3' && !spec[1]) {
        *out = spec[0] - '0';
        return TD_OK;
    }
    if (!*spec) return td_error(TD_ERR_INVALID, "an empty value");
    if (!strchr(spec, ':')) return td_error(TD_ERR_INVALID, "not a value from 0 to 3");
    /* LOCAL_RANK:VALUE,...: every item is checked, not only the rank asked for, so that a
     * typo anywhere is refused before anything starts. */
    int value = 0;
    for (const char *item = spec;;) {
        const char *end = strchr(item, ','), *colon = strchr(item, ':');
        size_t n = end ? (size_t)(end - item) : strlen(item);
        long rank = colon && colon < item + n ? parse_digits(item, (size_t)(colon - item)) : -1;
        long v = rank >= 0 ? parse_digits(colon + 1, (size_t)(item + n - colon - 1)) : -1;
        if (rank < 0 || v < 0 || v > 3)
            return td_error(TD_ERR_INVALID, "'%.*s' is not LOCAL_RANK:VALUE with VALUE 0-3", (int)n,
                            item);
        if (rank == local_rank) value = (int)v; /* given twice: the later one, as torchrun */
        if (!end) break;
        item = end + 1;
    }
    *out = value;
    return TD_OK;
}

int td_launch_visible_gpus(const char *cvd, int ndevices) {
    if (!cvd) return ndevices;
    char *list = td_xstrdup(cvd), *save = NULL;
    char **seen = td_xcalloc(strlen(cvd) + 1, sizeof *seen);
    int count = 0;
    /* strtok_r would skip an empty item ("0,,1"), which CUDA takes as the end of the list. */
    for (char *item = list; item; item = save) {
        save = strchr(item, ',');
        if (save) *save++ = '\0';
        while (*item == ' ' || *item == '\t') item++;
        size_t n = strlen(item);
        while (n > 0 && (item[n - 1] == ' ' || item[n - 1] == '\t')) item[--n] = '\0';
        bool uuid = !strncmp(item, "GPU-", 4) || !strncmp(item, "MIG-", 4);
        long index = uuid ? 0 : parse_digits(item, n);
        if (!uuid && (index < 0 || index >= ndevices)) break;
        bool repeat = false;
        for (int i = 0; i < count && !repeat; i++) repeat = !strcmp(seen[i], item);
        if (repeat) break;
        seen[count++] = item;
    }
    free(seen);
    free(list);
    return count;
}

int td_launch_driver_gpus(void) {
    DIR *d = opendir("/proc/driver/nvidia/gpus"); /* one entry per GPU, named by its PCI address */
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

td_status td_launch_find_python(char **path, const char **source) {
    static const char *const vars[] = {"TANDEM_PYTHON", "PYTHON_EXEC", "PYTHON"};
    *path = NULL;
    for (size_t i = 0; i < TD_ARRAY_LEN(vars); i++) {
        const char *v = getenv(vars[i]);
        if (!v || !*v) continue;
        if (source) *source = vars[i];
        *path = td__which(v);
        if (*path) return TD_OK;
        return td_error(TD_ERR_NOTFOUND,
                        "%s=%s: %s; point it at a Python interpreter (or unset it)", vars[i], v,
                        strchr(v, '/') ? "no executable file there" : "not found on PATH");
    }
    const char *venv = getenv("VIRTUAL_ENV");
    if (venv && *venv) {
        if (source) *source = "VIRTUAL_ENV";
        char *cand = td_xasprintf("%s/bin/python3", venv);
        if (is_executable_file(cand)) {
            *path = cand;
            return TD_OK;
        }
        td_status st = td_error(TD_ERR_NOTFOUND,
                                "VIRTUAL_ENV=%s (an active virtual environment) has no "
                                "executable %s; deactivate it, or set PYTHON=/path/to/python3",
                                venv, cand);
        free(cand);
        return st;
    }
    if (source) *source = "PATH";
    *path = td__which("python3");
    if (*path) return TD_OK;
    return td_error(TD_ERR_NOTFOUND,
                    "no Python interpreter: none of TANDEM_PYTHON, PYTHON_EXEC, PYTHON and "
                    "VIRTUAL_ENV is set and no python3 is on PATH; set PYTHON=/path/to/python3, "
                    "or run the command itself with --no-python");
}

/* The GPUs a worker started here would see, as torch.cuda.device_count() counts them: CUDA's
 * own count (cuda_count, when the caller has CUDA) first; else the driver's GPUs as
 * CUDA_VISIBLE_DEVICES narrows them. why says what was seen. */
static int count_gpus(int (*cuda_count)(void), char *why, size_t cap) {
    int n = cuda_count ? cuda_count() : 0;
    if (n > 0) {
        snprintf(why, cap, "CUDA sees %d device%s", n, n == 1 ? "" : "s");
        return n;
    }
    int ndev = td_launch_driver_gpus();
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    n = td_launch_visible_gpus(cvd, ndev);
    if (ndev == 0)
        snprintf(why, cap, "no NVIDIA driver on this machine (/proc/driver/nvidia/gpus is absent)");
    else if (cvd)
        snprintf(why, cap, "%d of this machine's %d GPU%s visible with CUDA_VISIBLE_DEVICES='%s'",
                 n, ndev, ndev == 1 ? "" : "s", cvd);
    else
        snprintf(why, cap, "this machine has %d GPU%s", ndev, ndev == 1 ? "" : "s");
    return n;
}

bool td_launch_nproc_is_spec(const char *val) {
    return val && (!strcmp(val, "gpu") || !strcmp(val, "auto") || !strcmp(val, "cpu"));
}

td_status td_launch_nproc_resolve(const char *what, const char *val, int (*cuda_count)(void),
                                  int *out, char *note, size_t cap) {
    if (note && cap) note[0] = '\0';
    bool gpu = !strcmp(val, "gpu"), aut = !strcmp(val, "auto");
    if (gpu || aut) {
        char why[256];
        int n = count_gpus(cuda_count, why, sizeof why);
        if (n > 0) {
            if (note)
                snprintf(note, cap, "%s %s: %d worker%s, one per GPU (%s)", what, val, n,
                         n == 1 ? "" : "s", why);
            *out = n;
            return TD_OK;
        }
        if (gpu)
            return td_error(TD_ERR_USAGE,
                            "%s gpu: no GPU is visible to this launcher: %s; give a number of "
                            "workers, or cpu (one per core)",
                            what, why);
        *out = td_num_cores();
        if (note)
            snprintf(note, cap, "%s auto: %d worker%s, one per core (%s)", what, *out,
                     *out == 1 ? "" : "s", why);
        return TD_OK;
    }
    if (!strcmp(val, "cpu")) {
        *out = td_num_cores();
        return TD_OK;
    }
    long v = parse_digits(val, strlen(val));
    if (v < 1 || v > 1000000)
        return td_error(TD_ERR_USAGE,
                        "%s '%s': expected a number of workers >= 1, or gpu (one per visible "
                        "GPU), cpu (one per core) or auto (gpu where a GPU is visible, else cpu)",
                        what, val);
    *out = (int)v;
    return TD_OK;
}
