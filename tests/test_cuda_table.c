/* test_cuda_table.c — what can be known of the CUDA backend without a GPU.
 *
 * - Completeness: every kernel entry the CPU backend fills
 *   (REGC_BACKEND_KERNELS) is filled by the CUDA module's table too, so a
 *   kernel missing on the GPU fails here rather than in a user's run. The
 *   comparison is itself checked on a table with one entry cleared.
 * - The PTX of every CUDA file (the build writes it beside the module)
 *   holds no fma and no approximate instruction: the per-element kernels
 *   give the CPU's bits only if every multiply and add rounds on its own
 *   (--fmad=false) and nothing is approximated.
 * - ptxas -v over that PTX reports no register spills.
 * - Without a usable GPU, `regc train --backend cuda` says why in one line
 *   ("no CUDA device: " and the reason, where the module is built)
 *   and exits 1.
 * In a build without CUDA there is no table; the test then checks that the
 * backend is refused by name. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "regc_backend.h"
#include "regc_common.h"
#include "test_util.h"

/* The first kernel entry `have` fills and `got` leaves NULL, or NULL. */
static const char *first_missing(const regc_backend *have, const regc_backend *got)
{
#define CHECK_ENTRY(fn)                                                                            \
    if (have->fn && !got->fn)                                                                      \
        return #fn;
    REGC_BACKEND_KERNELS(CHECK_ENTRY)
#undef CHECK_ENTRY
    return NULL;
}

static void test_cuda_fills_every_cpu_kernel(void **state)
{
    (void)state;
    regc_backend *cpu = regc_backend_cpu_new(1);
    assert_non_null(cpu);
    const regc_cuda_module *m = regc_cuda_module_get();
    if (!REGC_TEST_CUDA_MODULE) {
        assert_null(m);
        assert_non_null(strstr(regc_error_message(), "without the CUDA backend"));
        regc_backend_free(cpu);
        return;
    }
    if (!m)
        fail_msg("the CUDA module does not load: %s", regc_error_message());
    regc_backend table;
    memset(&table, 0, sizeof table);
    m->fill_table(&table);
    const char *missing = first_missing(cpu, &table);
    if (missing)
        fail_msg("the CUDA backend has no kernel %s, which the CPU backend has", missing);
    /* the comparison finds a gap: the table with one entry cleared */
    table.attention_bwd = NULL;
    missing = first_missing(cpu, &table);
    assert_non_null(missing);
    assert_string_equal(missing, "attention_bwd");
    regc_backend_free(cpu);
}

/* The PTX files the build wrote, one path per line. */
static char **ptx_files(int *n)
{
    char *list = regc_test_read_file(REGC_TEST_PTX_LIST, NULL);
    if (!list)
        fail_msg("%s: cannot read the list of PTX files", REGC_TEST_PTX_LIST);
    char **files = NULL;
    *n = 0;
    for (char *line = strtok(list, "\n"); line; line = strtok(NULL, "\n")) {
        files = realloc(files, (size_t)(*n + 1) * sizeof *files);
        assert_non_null(files);
        files[(*n)++] = strdup(line);
    }
    free(list);
    if (*n == 0)
        fail_msg("%s names no PTX file", REGC_TEST_PTX_LIST);
    return files;
}

static void free_files(char **files, int n)
{
    for (int i = 0; i < n; i++)
        free(files[i]);
    free(files);
}

/* An instruction that contracts a float multiply and add (fma, mad on
 * .f16/.f32/.f64; the integer mad.lo of index arithmetic is exact) or
 * approximates (sin, cos, ex2, lg2, rsqrt, the fast division and square
 * root: .approx; flushing denormals: .ftz). */
static int banned_instruction(const char *line, size_t len)
{
    while (len > 0 && (*line == ' ' || *line == '\t'))
        line++, len--;
    char buf[512];
    snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), line);
    const char *space = strpbrk(buf, " \t");
    if (space)
        buf[space - buf] = '\0'; /* the opcode alone */
    return ((!strncmp(buf, "fma.", 4) || !strncmp(buf, "mad.", 4)) && strstr(buf, ".f")) ||
           strstr(buf, ".approx") || strstr(buf, ".ftz");
}

/* The function a PTX line declares (".entry NAME(" or ".func ... NAME("
 * at the start of a line), copied into name; 0 when it declares none. */
static int declared_function(const char *p, size_t len, char *name, size_t cap)
{
    if (p[0] == '\t' || p[0] == ' ')
        return 0;
    const char *open = memchr(p, '(', len), *kind = strstr(p, ".entry ");
    if (!kind || kind > p + len)
        kind = strstr(p, ".func ");
    if (!kind || kind > p + len || !open)
        return 0;
    /* the name is the last word before the parenthesis that opens the
     * parameters (a .func's return value comes first, in parentheses) */
    const char *end = p + len;
    const char *params = open;
    for (const char *q = open; q < end; q++)
        if (*q == '(')
            params = q;
    const char *start = params;
    while (start > p && start[-1] != ' ' && start[-1] != ')')
        start--;
    snprintf(name, cap, "%.*s", (int)(params - start), start);
    return 1;
}

/* The one kernel allowed libdevice's pow and cos: the optimizer's schedule,
 * a single thread forming the step's learning rate and AdamW's
 * coefficients in double before rounding them to float. Its helpers
 * (libdevice's __internal_* functions) are allowed when that kernel alone
 * calls them. */
static int schedule_kernel(const char *name) { return strstr(name, "step_schedule") != NULL; }

static int allowed_function(const char *text, const char *name)
{
    if (schedule_kernel(name))
        return 1;
    if (strncmp(name, "__internal_", 11) != 0)
        return 0;
    char function[256] = "";
    for (const char *p = text; *p;) {
        const char *end = strchr(p, '\n');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *hit = strstr(p, name);
        if (!declared_function(p, len, function, sizeof function) && hit && hit < p + len &&
            strstr(p, "call") && strstr(p, "call") < p + len && !schedule_kernel(function))
            return 0;
        p += len + (end != NULL);
    }
    return 1;
}

/* The first banned line of PTX text outside an allowed function, with the
 * function it is in, copied into line; 0 when none. */
static int find_banned(const char *text, char *line, size_t cap)
{
    char function[256] = "";
    for (const char *p = text; *p;) {
        const char *end = strchr(p, '\n');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        if (!declared_function(p, len, function, sizeof function) && banned_instruction(p, len) &&
            !allowed_function(text, function)) {
            snprintf(line, cap, "%s: %.*s", function, (int)len, p);
            return 1;
        }
        p += len + (end != NULL);
    }
    return 0;
}

static void test_ptx_has_no_fma_or_approximation(void **state)
{
    (void)state;
    if (!REGC_TEST_CUDA_MODULE)
        return; /* nothing compiled */
    int n;
    char **files = ptx_files(&n);
    /* the check finds one where there is one */
    char line[512];
    assert_true(find_banned("\tmov.f32 %f1, 0f3F800000;\n\tfma.rn.f32 %f2, %f1, %f1, %f1;\n", line,
                            sizeof line));
    assert_non_null(strstr(line, "fma.rn.f32"));
    assert_false(find_banned("\tmul.rn.f32 %f2, %f1, %f1;\n\tdiv.rn.f32 %f3, %f2, %f1;\n"
                             "\tmad.lo.s32 %r3, %r1, 72, %r2;\n",
                             line, sizeof line));
    assert_false(find_banned(".visible .entry k_step_schedule(\n)\n{\n\tfma.rn.f64 %fd1, %fd2, "
                             "%fd3, %fd4;\n}\n",
                             line, sizeof line));
    assert_true(find_banned(".visible .entry k_adamw(\n)\n{\n\trcp.approx.ftz.f64 %fd1, %fd2;\n}\n",
                            line, sizeof line));
    assert_non_null(strstr(line, "k_adamw"));
    /* a libdevice helper: allowed while only the schedule calls it */
    const char *helper = ".func  (.param .b64 func_retval0) __internal_accurate_pow(\n)\n{\n"
                         "\trcp.approx.ftz.f64 %fd1, %fd2;\n}\n";
    char ptx[1024];
    snprintf(ptx, sizeof ptx,
             ".visible .entry k_step_schedule(\n)\n{\n\tcall.uni (r), "
             "__internal_accurate_pow, (a);\n}\n%s",
             helper);
    assert_false(find_banned(ptx, line, sizeof line));
    snprintf(ptx, sizeof ptx,
             ".visible .entry k_adamw(\n)\n{\n\tcall.uni (r), "
             "__internal_accurate_pow, (a);\n}\n%s",
             helper);
    assert_true(find_banned(ptx, line, sizeof line));
    for (int i = 0; i < n; i++) {
        char *ptx = regc_test_read_file(files[i], NULL);
        if (!ptx)
            fail_msg("%s: cannot read", files[i]);
        if (find_banned(ptx, line, sizeof line))
            fail_msg("%s: %s", files[i], line);
        free(ptx);
    }
    free_files(files, n);
}

static void test_ptxas_reports_no_spills(void **state)
{
    (void)state;
    if (!REGC_TEST_CUDA_MODULE)
        return;
    int n;
    char **files = ptx_files(&n);
    for (int i = 0; i < n; i++) {
        char *ptxas = regc_test_shell_quote(REGC_TEST_PTXAS),
             *ptx = regc_test_shell_quote(files[i]);
        char cmd[4096], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s -v --gpu-name sm_90 -o /dev/null %s 2>&1", ptxas, ptx);
        int status = regc_test_run_capture(cmd, &out);
        if (status != 0)
            fail_msg("%s exited %d:\n%s", cmd, status, out ? out : "");
        /* one "Used N registers" line per kernel, and a spill line each */
        if (!strstr(out, "Used "))
            fail_msg("%s: ptxas -v reported no kernel:\n%s", files[i], out);
        for (const char *p = strstr(out, "bytes spill"); p; p = strstr(p + 1, "bytes spill")) {
            const char *s = p;
            while (s > out && s[-1] != ',' && s[-1] != '\n')
                s--;
            if (strtol(s, NULL, 10) != 0)
                fail_msg("%s: register spills:\n%s", files[i], out);
        }
        printf("%s: ptxas -v, no spills\n", files[i]);
        free(out), free(ptxas), free(ptx);
    }
    free_files(files, n);
}

static void test_cuda_without_gpu_is_one_line(void **state)
{
    (void)state;
    if (REGC_TEST_CUDA_MODULE && regc_backend_cuda_device_count() > 0)
        return; /* a GPU is here: tests/gpu covers the backend */
    const char *argv[] = {REGC_BIN, "train",   "--model", "gpt2-tiny", "--backend",
                          "cuda",   "--steps", "1",       NULL};
    regc_test_proc p;
    int status = regc_test_run_argv(argv, &p);
    /* the model's description may come first; then one line, the last */
    const char *why = strstr(p.err, "regc: cuda:");
    const char *nl = why ? strchr(why, '\n') : NULL;
    if (status != 1 || !why || (why != p.err && why[-1] != '\n') || !nl || nl[1] != '\0')
        fail_msg("regc train --backend cuda without a GPU: expected exit 1 and one line, got "
                 "%d:\n%s",
                 status, p.err);
    /* with the module built, it loads (the toolkit on its run path) and
     * finds no device: the line says so, and why */
    if (REGC_TEST_CUDA_MODULE && !strstr(why, "cuda: no CUDA device: "))
        fail_msg("regc train --backend cuda without a GPU: expected \"no CUDA device\", got %s",
                 why);
    regc_test_proc_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_fills_every_cpu_kernel),
        cmocka_unit_test(test_ptx_has_no_fma_or_approximation),
        cmocka_unit_test(test_ptxas_reports_no_spills),
        cmocka_unit_test(test_cuda_without_gpu_is_one_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
