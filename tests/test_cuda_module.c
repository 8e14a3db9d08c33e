/* test_cuda_module.c — the CUDA libraries are loaded only when asked for.
 *
 * `regc` links none of cudart, cuBLASLt or NCCL (ldd), and a CPU training
 * run leaves none of them mapped in the process (/proc/self/maps). Where
 * the build has the CUDA module, asking for a GPU count maps them; a
 * module that REGC_CUDA_MODULE names but that is missing, not regc's, or
 * regc's from other sources (a module of the same table built before a
 * header changed) is refused with one line naming it. No GPU is needed
 * for any of this. */
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
#include "regc_models.h"
#include "regc_train.h"
#include "test_util.h"

static const char *const cuda_libraries[] = {"libcudart", "libcublas", "libnccl"};

/* The first CUDA library mapped into this process, or NULL. */
static const char *mapped_cuda_library(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[4096];
    const char *found = NULL;
    while (!found && fgets(line, sizeof line, f))
        for (size_t i = 0; i < sizeof cuda_libraries / sizeof *cuda_libraries; i++)
            if (strstr(line, cuda_libraries[i]))
                found = cuda_libraries[i];
    fclose(f);
    return found;
}

static void test_regc_links_no_cuda_library(void **state)
{
    (void)state;
    char *cmd = regc_test_shell_quote(REGC_BIN), *out = NULL, line[4200];
    snprintf(line, sizeof line, "ldd %s", cmd);
    assert_int_equal(regc_test_run_capture(line, &out), 0);
    for (size_t i = 0; i < sizeof cuda_libraries / sizeof *cuda_libraries; i++)
        if (strstr(out, cuda_libraries[i]))
            fail_msg("regc links %s:\n%s", cuda_libraries[i], out);
    free(out), free(cmd);
}

static void test_cpu_run_maps_no_cuda_library(void **state)
{
    (void)state;
    regc_model *m = NULL;
    assert_int_equal(regc_model_load("gpt2-tiny", &m), REGC_OK);
    regc_train_options o;
    regc_train_options_default(&o);
    o.batch = 2, o.seq = 16, o.steps = 2, o.cache_dir = NULL;
    assert_int_equal(regc_train(m, &o, NULL, NULL, NULL), REGC_OK);
    const char *lib = mapped_cuda_library();
    if (lib)
        fail_msg("a CPU training run mapped %s", lib);
    regc_model_free(m);
}

static void test_cuda_module_loads_when_asked(void **state)
{
    (void)state;
    assert_null(mapped_cuda_library());
    int n = regc_backend_cuda_device_count(); /* 0 without a GPU: no error either way */
    assert_true(n >= 0);
    if (REGC_TEST_CUDA_MODULE) {
        if (!mapped_cuda_library())
            fail_msg("asking for the GPUs did not load the CUDA module");
    } else {
        assert_int_equal(n, 0);
        assert_null(regc_backend_new("cuda", 0));
        assert_non_null(strstr(regc_error_message(), "without the CUDA backend"));
    }
}

/* A named module that is missing or not regc's: one line naming it. */
static void expect_module_refused(const char *module, const char *what)
{
    setenv("REGC_CUDA_MODULE", module, 1);
    const char *argv[] = {REGC_BIN, "train",   "--model", "gpt2-tiny", "--backend",
                          "cuda",   "--steps", "1",       NULL};
    regc_test_proc p;
    int status = regc_test_run_argv(argv, &p);
    unsetenv("REGC_CUDA_MODULE");
    if (status != 1 || !strstr(p.err, module) || !strstr(p.err, what))
        fail_msg("REGC_CUDA_MODULE=%s: expected exit 1 naming it and \"%s\", got %d:\n%s", module,
                 what, status, p.err);
    regc_test_proc_free(&p);
}

static void test_named_module_refused(void **state)
{
    (void)state;
    if (!REGC_TEST_CUDA_MODULE) /* nothing is loaded in a build without CUDA */
        return;
    expect_module_refused("/nonexistent/libregc_cuda.so", "No such file");
    /* a shared library, but not the module */
    char *out = NULL;
    assert_int_equal(
        regc_test_run_capture("ldd /bin/sh | sed -n 's/.*libc.so.6 => \\([^ ]*\\).*/\\1/p'", &out),
        0);
    out[strcspn(out, "\n")] = '\0';
    assert_true(out[0] == '/');
    expect_module_refused(out, "not a CUDA module of this build");
    free(out);
}

static int setup(void **state) { return regc_test_dir_setup(state, "cuda_module", "other.c"); }

/* A module with this build's table but another build's sources. */
static void test_module_of_other_sources_refused(void **state)
{
    regc_test_dir *f = *state;
    if (!REGC_TEST_CUDA_MODULE) /* nothing is loaded in a build without CUDA */
        skip();
    char text[1024], cmd[4096], *out = NULL;
    snprintf(text, sizeof text,
             "struct table { int abi; const char *source_id; void *fn[4]; };\n"
             "static const struct table t = {%d, \"0123456789abcdef\", {0}};\n"
             "const struct table *regc_cuda_module_entry(void *error) { (void)error; "
             "return &t; }\n",
             REGC_CUDA_MODULE_ABI);
    assert_int_equal(regc_test_write_text(f->dir, "other.c", text), 0);
    char *so = regc_test_join(f->dir, "libother.so");
    snprintf(cmd, sizeof cmd, "cc -shared -fPIC -o %s %s 2>&1", so, f->path);
    if (regc_test_run_capture(cmd, &out) != 0)
        fail_msg("%s: %s", cmd, out);
    free(out);
    expect_module_refused(so, "sources 0123456789abcdef; expected");
    free(so);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regc_links_no_cuda_library),
        cmocka_unit_test(test_cpu_run_maps_no_cuda_library),
        cmocka_unit_test(test_cuda_module_loads_when_asked),
        cmocka_unit_test(test_named_module_refused),
        regc_test_in_dir(test_module_of_other_sources_refused, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
