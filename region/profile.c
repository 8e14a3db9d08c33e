/* profile.c — where a step's time goes: wall time summed per row (a kernel
 * and its shape), reported per run, largest first. */
#include <stdlib.h>
#include <string.h>

#include "regc_region.h"

typedef struct {
    char label[REGC_PROFILE_LABEL];
    double ms;   /* summed over every call */
    double flop; /* summed; 0 for rows that are not counted in FLOPs */
    long calls;
} profile_row;

struct regc_profile {
    profile_row *rows;
    int n_rows, cap_rows;
    int runs;
};

regc_profile *regc_profile_new(void)
{
    regc_profile *pr = calloc(1, sizeof *pr);
    if (!pr)
        regc_error(REGC_ERR_MEMORY, "out of memory creating a profile");
    return pr;
}

void regc_profile_free(regc_profile *pr)
{
    if (!pr)
        return;
    free(pr->rows);
    free(pr);
}

int regc_profile_add(regc_profile *pr, const char *label, double ms, double flop)
{
    int i = 0;
    while (i < pr->n_rows && strcmp(pr->rows[i].label, label) != 0)
        i++;
    if (i == pr->n_rows) {
        if (pr->n_rows == pr->cap_rows) {
            int cap = pr->cap_rows ? 2 * pr->cap_rows : 64;
            profile_row *r = realloc(pr->rows, (size_t)cap * sizeof *r);
            if (!r)
                return regc_error(REGC_ERR_MEMORY, "out of memory growing a profile");
            pr->rows = r, pr->cap_rows = cap;
        }
        memset(&pr->rows[i], 0, sizeof pr->rows[i]);
        snprintf(pr->rows[i].label, sizeof pr->rows[i].label, "%s", label);
        pr->n_rows++;
    }
    pr->rows[i].ms += ms;
    pr->rows[i].flop += flop;
    pr->rows[i].calls++;
    return REGC_OK;
}

void regc_profile_count_run(regc_profile *pr) { pr->runs++; }
int regc_profile_runs(const regc_profile *pr) { return pr->runs; }
int regc_profile_n_rows(const regc_profile *pr) { return pr->n_rows; }

const char *regc_profile_row(const regc_profile *pr, int i, double *ms, double *flop, long *calls)
{
    const profile_row *r = &pr->rows[i];
    *ms = r->ms, *flop = r->flop, *calls = r->calls;
    return r->label;
}

static int by_time_desc(const void *a, const void *b)
{
    double x = ((const profile_row *)a)->ms, y = ((const profile_row *)b)->ms;
    return (x < y) - (x > y);
}

int regc_profile_write(const regc_profile *pr, FILE *f)
{
    int runs = pr->runs > 0 ? pr->runs : 1;
    profile_row *rows = malloc((size_t)(pr->n_rows ? pr->n_rows : 1) * sizeof *rows);
    if (!rows)
        return regc_error(REGC_ERR_MEMORY, "out of memory writing a profile");
    memcpy(rows, pr->rows, (size_t)pr->n_rows * sizeof *rows);
    qsort(rows, (size_t)pr->n_rows, sizeof *rows, by_time_desc);
    double total = 0.0, flop = 0.0, flop_ms = 0.0;
    for (int i = 0; i < pr->n_rows; i++) {
        total += rows[i].ms;
        if (rows[i].flop > 0.0)
            flop += rows[i].flop, flop_ms += rows[i].ms;
    }
    fprintf(f, "profile over %d run%s, per run:\n", pr->runs, pr->runs == 1 ? "" : "s");
    fprintf(f, "%10s %7s %7s %8s  %s\n", "ms", "share", "calls", "GFLOP/s", "kernel");
    for (int i = 0; i < pr->n_rows; i++) {
        const profile_row *r = &rows[i];
        char rate[16] = "";
        if (r->flop > 0.0 && r->ms > 0.0)
            snprintf(rate, sizeof rate, "%.1f", r->flop / (r->ms * 1e6));
        fprintf(f, "%10.2f %6.1f%% %7.1f %8s  %s\n", r->ms / runs,
                total > 0.0 ? 100.0 * r->ms / total : 0.0, (double)r->calls / runs, rate, r->label);
    }
    fprintf(f, "%10.2f %6.1f%% %7s %8s  total", total / runs, 100.0, "", "");
    if (flop_ms > 0.0)
        fprintf(f, " (GEMMs %.2f ms at %.1f GFLOP/s, %.1f%% of the time)", flop_ms / runs,
                flop / (flop_ms * 1e6), total > 0.0 ? 100.0 * flop_ms / total : 0.0);
    fputc('\n', f);
    free(rows);
    return ferror(f) ? regc_error(REGC_ERR_IO, "writing the profile failed") : REGC_OK;
}
