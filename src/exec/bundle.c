/* The tandem bundle: this binary, the libraries it loaded, the SDK, and a manifest, shipped to a
 * new host over ssh (bundle.h says what and why; docs/cloud.md "Shipping tandem").
 *
 * Why ssh and not S3: the carrier has an ssh link to every host anyway (its agent runs over it),
 * a bucket is optional (checkpoint_dir may be local or absent) and would need the instance role
 * to read it, and the bundle (about 20 MB compressed) crosses one ssh stream in well under a
 * second inside a region. Why the libraries loaded and not those `ldd` lists: dl_iterate_phdr
 * names exactly the files this process runs with (Debian's OpenBLAS alternative resolved), and
 * needs no tool that a machine may lack. */
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <glob.h>
#include <jansson.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "exec/bundle.h"
#include "exec/internal.h"
#include "tandem/cloud.h"
#include "tandem/os.h"

#define PROBE_TIMEOUT_S 60.0
#define SEND_TIMEOUT_S  600.0
#define REMOTE_DIR      "$HOME/.cache/tandem/bundles/"

/* ---- what goes in ---- */
/* Libraries that come with the target's glibc, which must be the target's own: a C library
 * from another machine does not match its loader, and the loader is found by absolute path. GPU
 * driver libraries (libcuda, libnvidia-*) belong to the target's driver. */
static bool provided_by_target(const char *base) {
    static const char *const prefixes[] = {
        "libc.so",      "ld-linux",   "ld64.so",      "libm.so",        "libmvec.so",
        "libpthread.so", "libdl.so",  "librt.so",     "libresolv.so",   "libnss_",
        "libutil.so",   "libanl.so",  "libthread_db", "libBrokenLocale", "libcuda.so",
        "libnvidia-",   "linux-vdso", "linux-gate",
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(prefixes); i++)
        if (!strncmp(base, prefixes[i], strlen(prefixes[i]))) return true;
    return false;
}

typedef struct {
    char **paths;
    size_t n;
} lib_list;

static int add_loaded(struct dl_phdr_info *info, size_t size, void *user) {
    (void)size;
    lib_list *l = user;
    const char *name = info->dlpi_name;
    if (!name || name[0] != '/') return 0; /* the executable itself (""), the vDSO */
    const char *slash = strrchr(name, '/');
    if (provided_by_target(slash + 1)) return 0;
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(strrchr(l->paths[i], '/'), slash)) return 0; /* one file per soname */
    l->paths = realloc(l->paths, (l->n + 1) * sizeof *l->paths);
    if (!l->paths) abort();
    l->paths[l->n++] = td_xstrdup(name);
    return 0;
}

static void lib_list_free(lib_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->paths[i]);
    free(l->paths);
    memset(l, 0, sizeof *l);
}

/* bundle.h: a portable install's binaries, each level beside `tandem`. */
size_t td__bundle_levels(char *exe, char ***paths) {
    lib_list found = {0};
    *paths = NULL;
    char *slash = strrchr(exe, '/');
    if (!slash) return 0;
    char *dir = td_xstrndup(exe, (size_t)(slash - exe));
    char *main_exe = td_install_binary(exe);
    snprintf(exe, PATH_MAX, "%s", main_exe);
    char *pat = td_xasprintf("%s/tandem-x86-64*", dir);
    glob_t g;
    if (glob(pat, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) {
            const char *base = strrchr(g.gl_pathv[i], '/') + 1;
            bool level = !strcmp(base, "tandem-x86-64") ||
                         (strlen(base) == 16 && !strncmp(base, "tandem-x86-64-v", 15) &&
                          base[15] >= '2' && base[15] <= '4');
            if (!level || access(g.gl_pathv[i], X_OK) != 0) continue;
            found.paths = realloc(found.paths, (found.n + 1) * sizeof *found.paths);
            if (!found.paths) abort();
            found.paths[found.n++] = td_xstrdup(g.gl_pathv[i]);
        }
        globfree(&g);
    }
    free(pat);
    free(main_exe);
    free(dir);
    *paths = found.paths;
    return found.n;
}

/* The highest GLIBC_x.y that an ELF file's version needs (.gnu.version_r) name, as x*1000+y; 0
 * for none (or a file that is no 64-bit ELF: then the check cannot say, and the run-check on
 * the host does). */
static int elf_glibc_needed(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat sb;
    int best = 0;
    if (fstat(fd, &sb) != 0 || sb.st_size < (off_t)sizeof(Elf64_Ehdr)) {
        close(fd);
        return 0;
    }
    size_t n = (size_t)sb.st_size;
    const unsigned char *m = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return 0;
    const Elf64_Ehdr *eh = (const void *)m;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
        eh->e_shoff == 0 || eh->e_shentsize != sizeof(Elf64_Shdr) ||
        eh->e_shoff + (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr) > n)
        goto out;
    const Elf64_Shdr *sh = (const void *)(m + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_GNU_verneed || sh[i].sh_link >= eh->e_shnum) continue;
        const Elf64_Shdr *strs = &sh[sh[i].sh_link];
        if (strs->sh_offset + strs->sh_size > n || sh[i].sh_offset + sh[i].sh_size > n) continue;
        const char *str = (const char *)m + strs->sh_offset;
        uint64_t off = sh[i].sh_offset, end = sh[i].sh_offset + sh[i].sh_size;
        for (int guard = 0; guard < 1024 && off + sizeof(Elf64_Verneed) <= end; guard++) {
            const Elf64_Verneed *vn = (const void *)(m + off);
            uint64_t aoff = off + vn->vn_aux;
            for (int k = 0; k < vn->vn_cnt && aoff + sizeof(Elf64_Vernaux) <= end; k++) {
                const Elf64_Vernaux *va = (const void *)(m + aoff);
                if (va->vna_name < strs->sh_size) {
                    int maj = 0, min = 0;
                    if (sscanf(str + va->vna_name, "GLIBC_%d.%d", &maj, &min) == 2 &&
                        maj * 1000 + min > best)
                        best = maj * 1000 + min;
                }
                if (!va->vna_next) break;
                aoff += va->vna_next;
            }
            if (!vn->vn_next) break;
            off += vn->vn_next;
        }
    }
out:
    munmap((void *)m, n);
    return best;
}

/* The SDK of this binary: the source tree's python/ above it (build/tandem), the portable
 * wheel's beside it (<site-packages>/tandem.scripts/tandem: <site-packages>/tandem), or a pip
 * install's site-packages beside its bin/. NULL when none (caller frees): the bundle goes
 * without it, and says so. */
static char *sdk_dir_of(const char *exe) {
    char *dir = td_xstrdup(exe);
    for (int up = 0; up < 5; up++) {
        char *slash = strrchr(dir, '/');
        if (!slash || slash == dir) break;
        *slash = '\0';
        char *init = td_xasprintf("%s/python/tandem/__init__.py", dir);
        bool found = access(init, R_OK) == 0;
        free(init);
        if (found) {
            char *sdk = td_xasprintf("%s/python/tandem", dir);
            free(dir);
            return sdk;
        }
        const char *base = strrchr(dir, '/');
        if (up == 0 && base && !strcmp(base, "/tandem.scripts")) {
            /* the portable wheel's: <site-packages>/tandem.scripts/tandem */
            char *wheel = td_xasprintf("%.*s/tandem", (int)(base - dir), dir);
            char *winit = td_xasprintf("%s/__init__.py", wheel);
            bool in_wheel = access(winit, R_OK) == 0;
            free(winit);
            if (in_wheel) {
                free(dir);
                return wheel;
            }
            free(wheel);
        }
        if (up == 0) { /* <env>/bin/tandem: <env>/lib/pythonX.Y/site-packages/tandem */
            char *pat = td_xasprintf("%s/../lib/python3*/site-packages/tandem/__init__.py", dir);
            glob_t g;
            bool hit = glob(pat, 0, NULL, &g) == 0 && g.gl_pathc > 0;
            char *sdk = NULL;
            if (hit) {
                sdk = td_xstrdup(g.gl_pathv[0]);
                *strrchr(sdk, '/') = '\0';
            }
            if (hit) globfree(&g);
            free(pat);
            if (sdk) {
                free(dir);
                return sdk;
            }
        }
    }
    free(dir);
    return NULL;
}

/* The SDK's files (not its caches) into the key: an edited SDK is another bundle. */
static td__buf *sdk_walk_buf;
static size_t sdk_walk_root;
static int sdk_walk(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    (void)ftw;
    if (type != FTW_F || strstr(path, "/__pycache__/")) return 0;
    td__buf_addf(sdk_walk_buf, "sdk %s %lld %lld\n", path + sdk_walk_root, (long long)sb->st_size,
                 (long long)sb->st_mtime);
    return 0;
}

static const char *cache_root(char *buf, size_t nbytes) {
    const char *x = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (x && x[0] == '/')
        snprintf(buf, nbytes, "%s/tandem/bundles", x);
    else if (home && home[0] == '/')
        snprintf(buf, nbytes, "%s/.cache/tandem/bundles", home);
    else
        return NULL;
    return buf;
}

/* The wrapper that is `tandem` on a host: the bundle's libraries first, the SDK importable,
 * once each however often it runs (a worker's `tandem train` goes through it again). */
static const char wrapper_text[] =
    "#!/bin/sh\n"
    "# tandem, shipped by tandem run: its own libraries first, its Python SDK importable\n"
    "d=$(CDPATH= cd -- \"$(dirname -- \"$0\")\" && pwd) || exit 127\n"
    "case \":${LD_LIBRARY_PATH:-}:\" in *\":$d/lib:\"*) ;; "
    "*) LD_LIBRARY_PATH=\"$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}\" ;; esac\n"
    "case \":${PYTHONPATH:-}:\" in *\":$d/python:\"*) ;; "
    "*) PYTHONPATH=\"$d/python${PYTHONPATH:+:$PYTHONPATH}\" ;; esac\n"
    "TANDEM_BUNDLE_LIB=\"$d/lib\"\n"
    "export LD_LIBRARY_PATH PYTHONPATH TANDEM_BUNDLE_LIB\n"
    "exec \"$d/bin/tandem\" \"$@\"\n";

static td_status file_entry(json_t *files, const char *path, const char *rel) {
    char hex[65];
    TD_CHECK(td_aws_sha256_file(path, 0, -1, hex));
    struct stat sb;
    if (stat(path, &sb) != 0) return td_error_errno(TD_ERR_IO, "bundle: %s", path);
    json_array_append_new(files, json_pack("{s:s, s:I, s:s}", "path", rel, "nbytes",
                                           (json_int_t)sb.st_size, "sha256", hex));
    return TD_OK;
}

/* A manifest entry for each of list's files as staged in STAGE/DIR under its own name. */
static td_status list_entries(json_t *files, const char *stage, const char *dir,
                              const lib_list *list) {
    td_status st = TD_OK;
    for (size_t i = 0; st == TD_OK && i < list->n; i++) {
        const char *base = strrchr(list->paths[i], '/') + 1;
        char *p = td_xasprintf("%s/%s/%s", stage, dir, base);
        char *rel = td_xasprintf("%s/%s", dir, base);
        st = file_entry(files, p, rel);
        free(p);
        free(rel);
    }
    return st;
}

/* Makes CACHE/KEY.tar.gz: a staging directory with the wrapper, bin/tandem, lib/, python/tandem
 * and manifest.json, packed by tar (which every host has: the code goes to it the same way). */
static td_status make_tarball(const td__bundle *b, const char *exe, const lib_list *levels,
                              const lib_list *libs, const char *sdk, const char *root) {
    char hex[17];
    TD_CHECK(td_random_hex(hex, 8));
    char *stage = td_xasprintf("%s/.stage-%s-%s", root, b->key, hex);
    char *tmp = td_xasprintf("%s.tmp-%s", b->tarball, hex);
    td__buf s = {0};
    td__buf_addf(&s, "set -e\numask 022\nS=");
    td__buf_quote(&s, stage);
    td__buf_addf(&s, "\nmkdir -p \"$S/bin\" \"$S/lib\" \"$S/python\"\ncp ");
    td__buf_quote(&s, exe);
    td__buf_addf(&s, " \"$S/bin/tandem\"\n");
    for (size_t i = 0; i < levels->n; i++) {
        td__buf_addf(&s, "cp ");
        td__buf_quote(&s, levels->paths[i]);
        td__buf_addf(&s, " \"$S/bin/\"\n");
    }
    for (size_t i = 0; i < libs->n; i++) {
        td__buf_addf(&s, "cp -L ");
        td__buf_quote(&s, libs->paths[i]);
        td__buf_addf(&s, " \"$S/lib/\"\n");
    }
    if (sdk) {
        char *parent = td_xstrdup(sdk);
        *strrchr(parent, '/') = '\0';
        td__buf_addf(&s, "tar -C ");
        td__buf_quote(&s, parent);
        td__buf_addf(&s, " --exclude=__pycache__ -cf - tandem | tar -C \"$S/python\" -xf -\n");
        free(parent);
    }
    td__buf_addf(&s, "chmod -R u+w,a+rX \"$S\"\n");
    char *script = s.s;
    char *argv[] = {"/bin/sh", "-c", script, NULL};
    char *out = NULL, *err = NULL;
    int code = 0;
    td_status st = td__exec_capture(argv, NULL, 300, &out, &err, &code);
    free(script);
    if (st == TD_OK && code != 0)
        st = td_error(TD_ERR_IO, "bundle: staging %s failed (exit code %d): %.400s", stage, code,
                      err ? err : "");
    free(out);
    free(err);
    out = err = NULL;
    /* the wrapper and the manifest (each file's SHA-256, as staged) */
    json_t *files = json_array();
    if (st == TD_OK) {
        char *w = td_xasprintf("%s/tandem", stage);
        td_chunk c = {wrapper_text, sizeof wrapper_text - 1};
        st = td_write_atomic(w, "bundle wrapper", &c, 1);
        if (st == TD_OK && chmod(w, 0755) != 0) st = td_error_errno(TD_ERR_IO, "chmod %s", w);
        free(w);
    }
    if (st == TD_OK) {
        char *p = td_xasprintf("%s/bin/tandem", stage);
        st = file_entry(files, p, "bin/tandem");
        free(p);
    }
    if (st == TD_OK) st = list_entries(files, stage, "bin", levels);
    if (st == TD_OK) st = list_entries(files, stage, "lib", libs);
    if (st == TD_OK) {
        json_t *m = json_pack("{s:i, s:s, s:s, s:s, s:s, s:s, s:b, s:o}", "format", 1, "key",
                              b->key, "os", b->os, "arch", b->arch, "glibc_needed",
                              b->glibc_needed, "exe_sha256", b->exe_sha256, "sdk", b->has_sdk,
                              "files", files);
        files = NULL;
        char *text = json_dumps(m, JSON_INDENT(1));
        json_decref(m);
        char *p = td_xasprintf("%s/manifest.json", stage);
        td_chunk c = {text, strlen(text)};
        st = td_write_atomic(p, "bundle manifest", &c, 1);
        free(p);
        free(text);
    }
    json_decref(files);
    if (st == TD_OK) { /* packed aside, then renamed: a reader sees a whole tarball or none */
        td__buf t = {0};
        td__buf_addf(&t, "set -e\ntar -C ");
        td__buf_quote(&t, stage);
        td__buf_addf(&t, " -czf ");
        td__buf_quote(&t, tmp);
        td__buf_addf(&t, " .\nmv -f ");
        td__buf_quote(&t, tmp);
        td__buf_addf(&t, " ");
        td__buf_quote(&t, b->tarball);
        td__buf_addf(&t, "\n");
        char *targv[] = {"/bin/sh", "-c", t.s, NULL};
        st = td__exec_capture(targv, NULL, 300, &out, &err, &code);
        if (st == TD_OK && code != 0)
            st = td_error(TD_ERR_IO, "bundle: packing %s failed (exit code %d): %.400s",
                          b->tarball, code, err ? err : "");
        free(t.s);
        free(out);
        free(err);
        out = err = NULL;
    }
    /* the staging directory and a partial tarball go, whatever happened */
    td__buf r = {0};
    td__buf_addf(&r, "rm -rf ");
    td__buf_quote(&r, stage);
    td__buf_addf(&r, " ");
    td__buf_quote(&r, tmp);
    char *rargv[] = {"/bin/sh", "-c", r.s, NULL};
    if (td__exec_capture(rargv, NULL, 60, &out, &err, &code) != TD_OK) td_error_clear();
    free(r.s);
    free(out);
    free(err);
    free(stage);
    free(tmp);
    return st;
}

td_status td__bundle_get(td__bundle *b) {
    memset(b, 0, sizeof *b);
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return td_error_errno(TD_ERR_SYS, "bundle: cannot read /proc/self/exe");
    exe[n] = '\0';
    struct utsname u;
    if (uname(&u) != 0) return td_error_errno(TD_ERR_SYS, "bundle: uname");
    snprintf(b->os, sizeof b->os, "%.15s", u.sysname);
    snprintf(b->arch, sizeof b->arch, "%.31s", u.machine);
    char root_buf[PATH_MAX];
    const char *root = cache_root(root_buf, sizeof root_buf);
    if (!root)
        return td_error(TD_ERR_INVALID, "bundle: neither XDG_CACHE_HOME nor HOME is an absolute "
                                        "path; set HOME (the bundle of tandem is cached there)");
    lib_list levels = {0};
    levels.n = td__bundle_levels(exe, &levels.paths);
    td_status hst = td_aws_sha256_file(exe, 0, -1, b->exe_sha256);
    if (hst != TD_OK) {
        lib_list_free(&levels);
        return hst;
    }
    lib_list libs = {0};
    dl_iterate_phdr(add_loaded, &libs);
    char *sdk = sdk_dir_of(exe);
    b->has_sdk = sdk != NULL;
    b->nlibs = libs.n;
    /* the key: the binary's bytes, each library's file (path, size, time), the SDK's files */
    td__buf k = {0};
    td__buf_addf(&k, "tandem-bundle 1\nexe %s\narch %s\n", b->exe_sha256, b->arch);
    int glibc = elf_glibc_needed(exe);
    for (size_t i = 0; i < levels.n; i++) {
        char lhex[65];
        if (td_aws_sha256_file(levels.paths[i], 0, -1, lhex) == TD_OK)
            td__buf_addf(&k, "level %s %s\n", strrchr(levels.paths[i], '/') + 1, lhex);
        int g = elf_glibc_needed(levels.paths[i]);
        if (g > glibc) glibc = g;
    }
    for (size_t i = 0; i < libs.n; i++) {
        struct stat sb;
        if (stat(libs.paths[i], &sb) == 0)
            td__buf_addf(&k, "lib %s %lld %lld\n", libs.paths[i], (long long)sb.st_size,
                         (long long)sb.st_mtime);
        int g = elf_glibc_needed(libs.paths[i]);
        if (g > glibc) glibc = g;
    }
    if (sdk) {
        sdk_walk_buf = &k;
        sdk_walk_root = strlen(sdk);
        nftw(sdk, sdk_walk, 16, FTW_PHYS);
        sdk_walk_buf = NULL;
    }
    char hex[65];
    td_aws_sha256_hex(k.s, k.len, hex);
    free(k.s);
    snprintf(b->key, sizeof b->key, "%.16s", hex);
    snprintf(b->glibc_needed, sizeof b->glibc_needed, "%d.%d", glibc / 1000, glibc % 1000);
    b->tarball = td_xasprintf("%s/%s.tar.gz", root, b->key);
    td_status st = TD_OK;
    struct stat sb;
    if (stat(b->tarball, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = td_mkdirs(root);
        if (st == TD_OK) st = make_tarball(b, exe, &levels, &libs, sdk, root);
        if (st == TD_OK && stat(b->tarball, &sb) != 0)
            st = td_error_errno(TD_ERR_IO, "bundle: %s", b->tarball);
    }
    if (st == TD_OK) b->nbytes = (int64_t)sb.st_size;
    lib_list_free(&libs);
    lib_list_free(&levels);
    free(sdk);
    if (st != TD_OK) td__bundle_clear(b);
    return st;
}

void td__bundle_clear(td__bundle *b) {
    free(b->tarball);
    memset(b, 0, sizeof *b);
}

/* ---- a host ---- */
td_status td__bundle_parse_probe(const char *text, td__bundle_host *h) {
    memset(h, 0, sizeof *h);
    int seen = 0;
    const char *p = text ? text : "";
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char line[1100];
        snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), p);
        const char *sp = strchr(line, ' ');
        const char *v = sp ? sp + 1 : "";
        size_t klen = sp ? (size_t)(sp - line) : strlen(line);
#define KEY(name) (klen == strlen(name) && !strncmp(line, name, klen))
        if (KEY("os")) {
            snprintf(h->os, sizeof h->os, "%.31s", v);
            seen |= 1;
        } else if (KEY("arch")) {
            snprintf(h->arch, sizeof h->arch, "%.31s", v);
            seen |= 2;
        } else if (KEY("glibc")) {
            snprintf(h->glibc, sizeof h->glibc, "%.31s", v);
            seen |= 4;
        } else if (KEY("dir")) {
            snprintf(h->dir, sizeof h->dir, "%.1023s", v);
            seen |= 8;
        } else if (KEY("have")) {
            h->have = !strcmp(v, "1");
            seen |= 16;
        }
#undef KEY
        p += len + (nl ? 1 : 0);
    }
    if (seen != 31 || h->dir[0] != '/')
        return td_error(TD_ERR_FORMAT,
                        "bundle: the host's answer to the probe lacks a line (os, arch, glibc, "
                        "dir, have) or its $HOME is not absolute: '%.300s'",
                        text ? text : "");
    return TD_OK;
}

static int version_num(const char *v) {
    int maj = 0, min = 0;
    if (sscanf(v, "%d.%d", &maj, &min) < 1) return -1;
    return maj * 1000 + min;
}

td_status td__bundle_check_host(const td__bundle *b, const td__bundle_host *h, const char *where) {
    static const char fix[] =
        "use an image that has tandem for it (aws.image, and aws.tandem: its path there) or build "
        "it there with aws.setup (and aws.tandem)";
    if (strcmp(h->os, b->os) || strcmp(h->arch, b->arch))
        return td_error(TD_ERR_INVALID,
                        "%s is %s %s, but this tandem is a %s %s binary: it cannot ship itself "
                        "there; %s, or choose %s instance types",
                        where, h->os, h->arch, b->os, b->arch, fix, b->arch);
    if (!h->glibc[0])
        return td_error(TD_ERR_INVALID,
                        "%s has no GNU C library (getconf GNU_LIBC_VERSION and ldd --version name "
                        "none: musl?), and this tandem needs glibc %s: it cannot ship itself "
                        "there; %s",
                        where, b->glibc_needed, fix);
    if (version_num(h->glibc) < version_num(b->glibc_needed))
        return td_error(TD_ERR_INVALID,
                        "%s has glibc %s, but this tandem (built on a newer system) needs glibc "
                        "%s: it cannot ship itself there; use a newer image (its distribution's "
                        "current release), or %s",
                        where, h->glibc, b->glibc_needed, fix);
    return TD_OK;
}

const char *td__bundle_uname_arch(const char *ec2_arch) {
    if (!strcmp(ec2_arch, "arm64")) return "aarch64";
    if (!strcmp(ec2_arch, "i386")) return "i686";
    return ec2_arch;
}

/* ssh_argv + one remote command (a /bin/sh script), with stdin from `input` (NULL: none). */
static td_status run_remote(char *const *ssh_argv, const char *script, const char *input,
                            double timeout_s, char **out, char **err, int *code) {
    size_t n = 0;
    while (ssh_argv[n]) n++;
    char **argv = td_xcalloc(n + 8, sizeof *argv);
    size_t k = 0;
    argv[k++] = "/bin/sh";
    argv[k++] = "-c";
    argv[k++] = input ? "f=$1; shift; exec \"$@\" <\"$f\"" : "shift; exec \"$@\"";
    argv[k++] = "sh";
    argv[k++] = (char *)(input ? input : "-");
    for (size_t i = 0; i < n; i++) argv[k++] = ssh_argv[i];
    td__buf r = {0};
    td__buf_add(&r, "/bin/sh -c ", 11);
    td__buf_quote(&r, script);
    argv[k++] = r.s;
    argv[k] = NULL;
    td_status st = td__exec_capture(argv, NULL, timeout_s, out, err, code);
    free(r.s);
    free(argv);
    return st;
}

td_status td__bundle_ship(const td__bundle *b, char *const *ssh_argv, const char *where,
                          char *tandem_out, size_t nbytes, int64_t *sent_nbytes) {
    *sent_nbytes = 0;
    /* 1. what the host is, and whether it has this bundle */
    char *probe = td_xasprintf(
        "printf 'os %%s\\narch %%s\\n' \"$(uname -s)\" \"$(uname -m)\"\n"
        "g=$(getconf GNU_LIBC_VERSION 2>/dev/null) || g=$(ldd --version 2>&1 | head -n 1)\n"
        "case \"$g\" in *glibc*|*GLIBC*|*'GNU libc'*) g=${g##* } ;; *) g= ;; esac\n"
        "printf 'glibc %%s\\n' \"$g\"\n"
        "D=\"" REMOTE_DIR "%s\"\nprintf 'dir %%s\\n' \"$D\"\n"
        "if [ -x \"$D/tandem\" ] && [ -f \"$D/manifest.json\" ]; then echo 'have 1'; "
        "else echo 'have 0'; fi\n",
        b->key);
    char *out = NULL, *err = NULL;
    int code = 0;
    td_status st = run_remote(ssh_argv, probe, NULL, PROBE_TIMEOUT_S, &out, &err, &code);
    free(probe);
    td__bundle_host h;
    if (st == TD_OK && code != 0) {
        char msg[600];
        td__exec_joined_lines(err && *err ? err : out, msg, sizeof msg);
        st = td_error(code == 255 || code == 124 ? TD_ERR_PEER : TD_ERR_IO,
                      "%s: asking it what it is (uname, glibc) failed (exit code %d): %s", where,
                      code, msg[0] ? msg : "no message");
    }
    if (st == TD_OK) st = td__bundle_parse_probe(out, &h);
    free(out);
    free(err);
    out = err = NULL;
    TD_CHECK(st);
    TD_CHECK(td__bundle_check_host(b, &h, where));
    /* 2. the bundle, unpacked aside and renamed into its versioned directory, then run once:
     * what does not run there (a library that does not load) is said now, not by each worker */
    if (!h.have) {
        char *send = td_xasprintf(
            "set -e\nD=\"" REMOTE_DIR "%s\"\nT=\"$D.part.$$\"\nrm -rf \"$T\"\nmkdir -p \"$T\"\n"
            "tar -xzf - -C \"$T\"\n"
            "if [ -x \"$D/tandem\" ]; then rm -rf \"$T\";\n"
            "else rm -rf \"$D\"; mv \"$T\" \"$D\"; fi\n"
            "\"$D/tandem\" --version >/dev/null\n",
            b->key);
        st = run_remote(ssh_argv, send, b->tarball, SEND_TIMEOUT_S, &out, &err, &code);
        free(send);
        if (st == TD_OK && code != 0) {
            char msg[600];
            td__exec_joined_lines(err && *err ? err : out, msg, sizeof msg);
            st = td_error(code == 255 ? TD_ERR_PEER : TD_ERR_IO,
                          "%s: sending tandem's bundle (%s, %.1f MB) into %s failed or it does not "
                          "run there (exit code %d): %s",
                          where, b->key, (double)b->nbytes / 1e6, h.dir, code,
                          msg[0] ? msg : "no message");
        }
        free(out);
        free(err);
        TD_CHECK(st);
        *sent_nbytes = b->nbytes;
    }
    snprintf(tandem_out, nbytes, "%s/tandem", h.dir);
    return TD_OK;
}
