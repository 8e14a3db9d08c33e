/* test_layering.c — the source tree keeps its layering (docs/ARCHITECTURE.md).
 *
 * Every folder sits on a layer; a file may include headers of its own
 * folder and of folders on lower layers only, never of a folder beside or
 * above it. A folder's public header is its regc_<name>.h; every other
 * header is private to the directory that holds it and those below it
 * (kernels/cpu and kernels/cuda share kernels/kernel_math.h; tests, which sit above
 * everything, may include private headers to test internals). The include
 * graph has no cycle. The checker reads the tree as the compiler would
 * resolve quoted includes: the including file's directory first, then the
 * library folders on the include path (and tests/support for tests). It is run on the real tree,
 * and on small trees made here that break each rule, so a check that could never fail would be
 * caught too. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "test_util.h"

/* The layers, bottom up; one table, mirrored by docs/ARCHITECTURE.md. */
static const struct {
    const char *dir;
    int layer;
} folders[] = {
    {"common", 0}, {"kernels", 1}, {"graph", 2},  {"data", 2},  {"detect", 3}, {"models", 3},
    {"cache", 3},  {"zero3", 3},   {"region", 4}, {"train", 5}, {"tools", 6},  {"tests", 7},
};
#define N_FOLDERS (int)(sizeof folders / sizeof folders[0])
#define TOOLS_LAYER 6 /* tools and tests are not on the library's include path */

/* Generated into the build tree, not the source tree. */
static const char *const generated[] = {"regc_source_id.h"};

typedef struct {
    char path[512]; /* relative to the root, e.g. "region/plan.h" */
    int folder;     /* index into folders */
    int n_inc;
    int inc[64]; /* resolved includes: file indices */
} src_file;

typedef struct {
    const char *root;
    int n, cap;
    src_file *f;
    char *report;
    size_t len, report_cap;
    int problems;
} tree;

static void problem(tree *t, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    size_t n = strlen(line);
    if (t->len + n + 2 > t->report_cap) {
        t->report_cap = 2 * (t->len + n + 2);
        t->report = realloc(t->report, t->report_cap);
        assert_non_null(t->report);
    }
    memcpy(t->report + t->len, line, n);
    t->len += n;
    t->report[t->len++] = '\n';
    t->report[t->len] = '\0';
    t->problems++;
}

static int is_source(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot && (!strcmp(dot, ".c") || !strcmp(dot, ".h") || !strcmp(dot, ".cu"));
}

static void add_files(tree *t, const char *rel, int folder)
{
    char abs[1024];
    snprintf(abs, sizeof abs, "%s/%s", t->root, rel);
    DIR *d = opendir(abs);
    if (!d)
        return; /* a folder with no code yet */
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char sub[512], full[1024];
        snprintf(sub, sizeof sub, "%s/%s", rel, e->d_name);
        snprintf(full, sizeof full, "%s/%s", t->root, sub);
        struct stat st;
        if (stat(full, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            add_files(t, sub, folder);
        } else if (is_source(e->d_name)) {
            if (t->n == t->cap) {
                t->cap = t->cap ? 2 * t->cap : 256;
                t->f = realloc(t->f, (size_t)t->cap * sizeof *t->f);
                assert_non_null(t->f);
            }
            src_file *f = &t->f[t->n++];
            memset(f, 0, sizeof *f);
            snprintf(f->path, sizeof f->path, "%s", sub);
            f->folder = folder;
        }
    }
    closedir(d);
}

static int find_file(const tree *t, const char *path)
{
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->f[i].path, path))
            return i;
    return -1;
}

static void dir_of(const char *path, char *out, size_t cap)
{
    snprintf(out, cap, "%s", path);
    char *slash = strrchr(out, '/');
    if (slash)
        *slash = '\0';
    else
        out[0] = '\0';
}

/* A quoted include from file i: its own directory first, then every
 * library folder (the include path). Returns the file index, -1 when it
 * is not in the tree. Two matches on the include path are a problem: a
 * header's name must say which one it is. */
static int resolve(tree *t, int i, const char *name)
{
    char dir[512], cand[1024];
    dir_of(t->f[i].path, dir, sizeof dir);
    snprintf(cand, sizeof cand, "%s/%s", dir, name);
    int hit = find_file(t, cand);
    if (hit >= 0)
        return hit;
    int found = -1, tests = folders[t->f[i].folder].layer > TOOLS_LAYER;
    for (int k = 0; k <= N_FOLDERS; k++) {
        /* the library's folders, and for tests their support code */
        if (k == N_FOLDERS ? !tests : folders[k].layer >= TOOLS_LAYER)
            continue;
        snprintf(cand, sizeof cand, "%s/%s", k == N_FOLDERS ? "tests/support" : folders[k].dir,
                 name);
        int x = find_file(t, cand);
        if (x >= 0 && found >= 0)
            problem(t, "%s: \"%s\" is ambiguous: %s and %s", t->f[i].path, name, t->f[found].path,
                    t->f[x].path);
        if (x >= 0 && found < 0)
            found = x;
    }
    return found;
}

static int is_generated(const char *name)
{
    for (size_t k = 0; k < sizeof generated / sizeof generated[0]; k++)
        if (!strcmp(name, generated[k]))
            return 1;
    return 0;
}

/* A public header: regc_<name>.h directly in its folder. */
static int is_public(const tree *t, int h)
{
    const char *p = t->f[h].path, *base = strrchr(p, '/');
    size_t folder_len = strlen(folders[t->f[h].folder].dir);
    return base && (size_t)(base - p) == folder_len && !strncmp(base + 1, "regc_", 5);
}

static void read_includes(tree *t, int i)
{
    char abs[1024];
    snprintf(abs, sizeof abs, "%s/%s", t->root, t->f[i].path);
    FILE *fp = fopen(abs, "r");
    assert_non_null(fp);
    char line[1024];
    while (fgets(line, sizeof line, fp)) {
        const char *p = line + strspn(line, " \t");
        if (*p != '#')
            continue;
        p += 1 + strspn(p + 1, " \t");
        if (strncmp(p, "include", 7) != 0)
            continue;
        p += 7 + strspn(p + 7, " \t");
        if (*p != '"')
            continue; /* <system> headers */
        const char *end = strchr(p + 1, '"');
        if (!end)
            continue;
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(end - p - 1), p + 1);
        int h = resolve(t, i, name);
        if (h < 0) {
            if (!is_generated(name))
                problem(t, "%s: includes \"%s\", which is not in the tree", t->f[i].path, name);
            continue;
        }
        src_file *f = &t->f[i];
        if (f->n_inc < (int)(sizeof f->inc / sizeof f->inc[0]))
            f->inc[f->n_inc++] = h;
    }
    fclose(fp);
}

static void check_rules(tree *t, int i)
{
    const src_file *f = &t->f[i];
    int layer = folders[f->folder].layer;
    for (int k = 0; k < f->n_inc; k++) {
        const src_file *h = &t->f[f->inc[k]];
        int hl = folders[h->folder].layer;
        if (h->folder != f->folder && hl >= layer)
            problem(t, "%s (layer %d, %s/) includes %s (layer %d, %s/): includes go downward only",
                    f->path, layer, folders[f->folder].dir, h->path, hl, folders[h->folder].dir);
        char fd[512], hd[512];
        dir_of(f->path, fd, sizeof fd);
        dir_of(h->path, hd, sizeof hd);
        size_t hn = strlen(hd);
        int inside = !strncmp(fd, hd, hn) && (fd[hn] == '\0' || fd[hn] == '/');
        if (!is_public(t, f->inc[k]) && !inside && layer < 7)
            problem(t, "%s includes %s, which is private to %s/", f->path, h->path, hd);
    }
}

/* Depth-first search; colour 1 on the stack, 2 done. */
static int find_cycle(tree *t, int i, char *colour, int *stack, int depth)
{
    colour[i] = 1;
    stack[depth] = i;
    for (int k = 0; k < t->f[i].n_inc; k++) {
        int h = t->f[i].inc[k];
        if (colour[h] == 1) {
            char chain[2048] = "";
            size_t len = 0;
            int from = depth;
            while (from > 0 && stack[from] != h)
                from--;
            for (int d = from; d <= depth; d++)
                len += (size_t)snprintf(chain + len, sizeof chain - len, "%s -> ",
                                        t->f[stack[d]].path);
            snprintf(chain + len, sizeof chain - len, "%s", t->f[h].path);
            problem(t, "include cycle: %s", chain);
            return 1;
        }
        if (colour[h] == 0 && find_cycle(t, h, colour, stack, depth + 1))
            return 1;
    }
    colour[i] = 2;
    return 0;
}

/* Check the tree at root; returns the number of problems, *report lists
 * them one per line (the caller frees it). */
static int check_tree(const char *root, char **report)
{
    tree t = {.root = root};
    for (int k = 0; k < N_FOLDERS; k++)
        add_files(&t, folders[k].dir, k);
    for (int i = 0; i < t.n; i++)
        read_includes(&t, i);
    for (int i = 0; i < t.n; i++)
        check_rules(&t, i);
    char *colour = calloc((size_t)t.n + 1, 1);
    int *stack = malloc(((size_t)t.n + 1) * sizeof *stack);
    for (int i = 0; i < t.n; i++)
        if (!colour[i] && find_cycle(&t, i, colour, stack, 0))
            break;
    /* one public header per library folder at most */
    for (int k = 0; k < N_FOLDERS; k++) {
        int n_public = 0;
        for (int i = 0; i < t.n; i++)
            n_public += t.f[i].folder == k && is_public(&t, i);
        if (folders[k].layer < TOOLS_LAYER && n_public > 1)
            problem(&t, "%s/ has %d public headers (regc_*.h): one per folder", folders[k].dir,
                    n_public);
    }
    free(colour), free(stack), free(t.f);
    *report = t.report ? t.report : strdup("");
    return t.problems;
}

/* ---- the real tree */

static void test_source_tree_is_layered(void **state)
{
    (void)state;
    char *report;
    int n = check_tree(REGC_SOURCE_DIR, &report);
    if (n) {
        fprintf(stderr, "%s", report); /* whole: fail_msg's buffer is short */
        fail_msg("%d layering problem(s), listed above", n);
    }
    free(report);
}

/* ---- the checker catches what it must */

static void put(const char *root, const char *path, const char *text)
{
    char full[1024], dir[1024];
    snprintf(full, sizeof full, "%s/%s", root, path);
    dir_of(full, dir, sizeof dir);
    char cmd[2100];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    assert_int_equal(system(cmd), 0);
    size_t n = strlen(text);
    assert_int_equal(regc_test_write_file(full, text, n), 0);
}

/* A small sound tree: graph over common, region over graph, a test. */
static char *sound_tree(void)
{
    char *root = regc_test_make_temp_dir("layering");
    assert_non_null(root);
    put(root, "common/regc_common.h", "/* */\n");
    put(root, "graph/regc_graph.h", "#include \"regc_common.h\"\n");
    put(root, "graph/graph_internal.h", "#include \"regc_graph.h\"\n");
    put(root, "graph/graph.c", "#include \"graph_internal.h\"\n#include <stdio.h>\n");
    put(root, "region/regc_region.h", "#include \"regc_graph.h\"\n");
    put(root, "region/plan.h", "#include \"regc_common.h\"\n");
    put(root, "region/plan.c", "#include \"plan.h\"\n#include \"regc_region.h\"\n");
    put(root, "tests/test_plan.c", "#include \"plan.h\"\n#include \"regc_region.h\"\n");
    return root;
}

static void expect_problem(const char *root, const char *what)
{
    char *report;
    int n = check_tree(root, &report);
    if (n < 1 || !strstr(report, what))
        fail_msg("expected a problem naming \"%s\", got %d:\n%s", what, n, report);
    free(report);
}

static void test_checker_accepts_a_sound_tree(void **state)
{
    (void)state;
    char *root = sound_tree(), *report;
    int n = check_tree(root, &report);
    if (n)
        fail_msg("a sound tree gave %d problem(s):\n%s", n, report);
    free(report);
    assert_int_equal(regc_test_remove_tree(root), 0);
    free(root);
}

static void test_checker_finds_an_upward_include(void **state)
{
    (void)state;
    char *root = sound_tree();
    put(root, "graph/graph_dump.c", "#include \"regc_region.h\"\n");
    expect_problem(root, "graph/graph_dump.c (layer 2, graph/) includes region/regc_region.h");
    assert_int_equal(regc_test_remove_tree(root), 0);
    free(root);
}

static void test_checker_finds_a_sideways_include(void **state)
{
    (void)state;
    char *root = sound_tree();
    put(root, "data/regc_data.h", "#include \"regc_graph.h\"\n");
    expect_problem(root, "data/regc_data.h (layer 2, data/) includes graph/regc_graph.h");
    assert_int_equal(regc_test_remove_tree(root), 0);
    free(root);
}

static void test_checker_finds_a_private_header_used_elsewhere(void **state)
{
    (void)state;
    char *root = sound_tree();
    put(root, "region/lower.c", "#include \"graph_internal.h\"\n");
    expect_problem(root, "region/lower.c includes graph/graph_internal.h, which is private");
    assert_int_equal(regc_test_remove_tree(root), 0);
    free(root);
}

static void test_checker_finds_an_include_cycle(void **state)
{
    (void)state;
    char *root = sound_tree();
    put(root, "region/program.h", "#include \"serial.h\"\n");
    put(root, "region/serial.h", "#include \"program.h\"\n");
    expect_problem(root, "include cycle: region/");
    assert_int_equal(regc_test_remove_tree(root), 0);
    free(root);
}

static void test_checker_finds_a_missing_header(void **state)
{
    (void)state;
    char *root = sound_tree();
    put(root, "region/lower.c", "#include \"nowhere.h\"\n");
    expect_problem(root, "region/lower.c: includes \"nowhere.h\", which is not in the tree");
    assert_int_equal(regc_test_remove_tree(root), 0);
    free(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_source_tree_is_layered),
        cmocka_unit_test(test_checker_accepts_a_sound_tree),
        cmocka_unit_test(test_checker_finds_an_upward_include),
        cmocka_unit_test(test_checker_finds_a_sideways_include),
        cmocka_unit_test(test_checker_finds_a_private_header_used_elsewhere),
        cmocka_unit_test(test_checker_finds_an_include_cycle),
        cmocka_unit_test(test_checker_finds_a_missing_header),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
