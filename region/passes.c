/* passes.c — the schedule passes: a registry of named functions that
 * decide when a multi-rank step's collectives run (DeepCompile's
 * register_compile_pass), and the driver that runs the ones a compile
 * names.
 *
 * The driver starts from the schedule the options fix whatever the passes
 * say (the live-parameter limit, the reduce bucket, the persistent units
 * resident; nothing started ahead, nothing overlapped), runs each named
 * pass in order on it, and links the step with the result. A pass that
 * weighs candidates links each (regc_pass_try), so the program it leaves
 * behind is whatever it tried last: the driver links again with the
 * decided schedule.
 *
 * The profile a pass sees is per unit, not per instruction: a re-plan
 * compiles another program than the one measured, and the units (a
 * layer's parameters, a piece of glue's) are what both share. A flat
 * program measured instruction by instruction (regc_program_measure)
 * gives it: an instruction's time goes to the unit whose all-gather was
 * waited for last, an all-gather's own time (on the communication thread)
 * to its unit. */
#include <stdlib.h>
#include <string.h>

#include "region_internal.h"

struct regc_pass_link {
    regc_program *p;
    const int64_t *param_offset;
    int inline_flat;
};

/* ---------------------------------------------------------------- built in */

/* How many units ahead an all-gather must start for the compute of the
 * units before it to cover it, at most 8: the largest need over the step's
 * units taken in order, each unit's compute per gather. */
static int64_t measured_depth(const regc_shard_layout *l, const regc_unit_profile *pr)
{
    int depth = 1;
    for (int k = 1; k < l->n_units; k++) {
        double covered = 0.0;
        int n = 0;
        while (n < k && n < 8 && covered < pr[k].gather_ms) {
            const regc_unit_profile *j = &pr[k - 1 - n];
            covered += j->gathers > 0 ? j->compute_ms / j->gathers : j->compute_ms;
            n++;
        }
        depth = n > depth ? n : depth;
    }
    return -depth;
}

static int pass_prefetch(const regc_pass_input *in, regc_comm_schedule *s, void *user)
{
    (void)user;
    if (!in->layout || !in->options->deepcompile)
        return REGC_OK;
    const int64_t asked = in->options->prefetch_floats;
    s->prefetch_floats = in->profile && asked < 0 ? measured_depth(in->layout, in->profile) : asked;
    return REGC_OK;
}

static int pass_overlap_reduce(const regc_pass_input *in, regc_comm_schedule *s, void *user)
{
    (void)user;
    s->overlap = in->options->deepcompile != 0;
    return REGC_OK;
}

/* ---------------------------------------------------------------- registry */

typedef struct {
    char name[REGC_PASS_NAME];
    regc_pass_fn fn;
    void *user;
} pass_entry;

#define MAX_REGISTERED 32
static pass_entry registry[MAX_REGISTERED] = {
    {"prefetch", pass_prefetch, NULL},
    {"overlap_reduce", pass_overlap_reduce, NULL},
    {"selective_gather", regc_pass_selective_gather, NULL},
};
static int n_registered = 3;

static const pass_entry *find(const char *name)
{
    for (int i = 0; i < n_registered; i++)
        if (!strcmp(registry[i].name, name))
            return &registry[i];
    return NULL;
}

int regc_pass_known(const char *name) { return name && find(name) != NULL; }

int64_t regc_compile_least_budget(const regc_compile_options *o)
{
    int64_t budget = o->budget_bytes;
    for (int i = 0; i < o->passes.n; i++)
        if (o->passes.pass[i].budget_bytes > 0 &&
            (budget <= 0 || o->passes.pass[i].budget_bytes < budget))
            budget = o->passes.pass[i].budget_bytes;
    return budget;
}

int regc_pass_register(const char *name, regc_pass_fn fn, void *user)
{
    if (!name || !name[0] || strlen(name) >= REGC_PASS_NAME || !fn)
        return regc_error(REGC_ERR_ARG,
                          "regc_pass_register: a name of 1 to %d bytes and a "
                          "function are needed",
                          REGC_PASS_NAME - 1);
    pass_entry *e = (pass_entry *)find(name);
    if (!e) {
        if (n_registered == MAX_REGISTERED)
            return regc_error(REGC_ERR_ARG, "regc_pass_register: %s: %d passes already", name,
                              MAX_REGISTERED);
        e = &registry[n_registered++];
        snprintf(e->name, sizeof e->name, "%s", name);
    }
    e->fn = fn, e->user = user;
    return REGC_OK;
}

void regc_pass_list_default(regc_pass_list *l)
{
    static const char *const names[] = {"prefetch", "overlap_reduce", "selective_gather"};
    memset(l, 0, sizeof *l);
    for (int i = 0; i < 3; i++)
        snprintf(l->pass[l->n++].name, REGC_PASS_NAME, "%s", names[i]);
}

/* ---------------------------------------------------------------- running */

static void apply(regc_program *p, const regc_comm_schedule *s)
{
    p->prefetch_floats = s->prefetch_floats;
    p->max_live_floats = s->max_live_floats;
    p->reduce_bucket_floats = s->reduce_bucket_floats;
    p->overlap = s->overlap;
    p->n_resident = 0;
    for (int u = 0; p->layout && u < p->layout->n_units; u++) {
        p->resident[u] = s->resident[u];
        p->n_resident += p->resident[u] != 0;
    }
    for (int u = 0; p->frozen_layout && u < p->frozen_layout->n_units; u++) {
        p->frozen_resident[u] = s->frozen_resident ? s->frozen_resident[u] : 0;
        p->n_resident += p->frozen_resident[u] != 0;
    }
}

int regc_pass_try(const regc_pass_input *in, const regc_comm_schedule *s, regc_device_memory *mem)
{
    regc_pass_link *k = in->link;
    regc_program_unlink(k->p);
    apply(k->p, s);
    int rc = regc_program_link(k->p, k->param_offset, k->inline_flat, NULL);
    if (rc == REGC_OK)
        regc_program_device_memory(k->p, mem);
    return rc;
}

int regc_passes_run(regc_program *p, const int64_t *param_offset, int inline_flat,
                    const regc_compile_options *o, regc_compile_stats *st)
{
    const regc_shard_layout *l = p->layout, *fl = p->frozen_layout;
    const int n_units = l ? l->n_units : 0, n_frozen = fl ? fl->n_units : 0;
    regc_comm_schedule s = {.max_live_floats = o->max_live_floats,
                            .reduce_bucket_floats = o->reduce_bucket_floats};
    free(p->resident), free(p->frozen_resident);
    p->resident = calloc((size_t)n_units + 1, 1);
    p->frozen_resident = calloc((size_t)n_frozen + 1, 1);
    s.resident = calloc((size_t)n_units + 1, 1);
    s.frozen_resident = fl ? calloc((size_t)n_frozen + 1, 1) : NULL;
    if (!p->resident || !p->frozen_resident || !s.resident || (fl && !s.frozen_resident)) {
        free(s.resident), free(s.frozen_resident);
        return regc_error(REGC_ERR_MEMORY, "compile: out of memory");
    }
    for (int u = 0; u < n_units; u++)
        s.resident[u] = l->unit_floats[u] <= o->persistence_floats;
    for (int u = 0; u < n_frozen; u++) /* DeepSpeed's threshold holds for frozen ones too */
        s.frozen_resident[u] = fl->unit_floats[u] <= o->persistence_floats;
    regc_pass_link link = {p, param_offset, inline_flat};
    regc_pass_input in = {
        .options = o,
        .layout = l,
        .frozen_layout = fl,
        .profile = l && o->unit_profile && o->n_unit_profile == n_units ? o->unit_profile : NULL,
        .link = &link};
    int rc = REGC_OK;
    for (int i = 0; i < o->passes.n && rc == REGC_OK; i++) {
        const pass_entry *e = find(o->passes.pass[i].name);
        if (!e) {
            rc = regc_error(REGC_ERR_ARG, "compile.passes: no pass named \"%s\"",
                            o->passes.pass[i].name);
            break;
        }
        in.budget_bytes =
            o->passes.pass[i].budget_bytes > 0 ? o->passes.pass[i].budget_bytes : o->budget_bytes;
        rc = e->fn(&in, &s, e->user);
    }
    if (rc == REGC_OK) {
        regc_program_unlink(p);
        apply(p, &s);
        rc = regc_program_link(p, param_offset, inline_flat, st);
    }
    free(s.resident), free(s.frozen_resident);
    /* a pass after the one that fitted a budget may have undone the fit
     * (under fit_check, the caller weighs what the step holds) */
    const int64_t budget = o->fit_check ? 0 : regc_compile_least_budget(o);
    regc_device_memory a;
    if (rc == REGC_OK && l && budget > 0 && (regc_program_device_memory(p, &a), a.total > budget))
        rc = regc_error(REGC_ERR_BUDGET,
                        "compile.passes: the step needs %.1f MiB per rank, over the budget of "
                        "%.1f MiB (a pass after selective_gather changed what it fitted?)",
                        (double)a.total / (1 << 20), (double)budget / (1 << 20));
    return rc;
}

/* ---------------------------------------------------------------- profile */

/* The unit whose shard lies at float `at` of a rank's block, or -1. */
static int unit_at(const regc_shard_layout *l, int64_t at)
{
    int lo = 0, hi = l->n_units;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (l->shard_offset[mid] < at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < l->n_units && l->shard_offset[lo] == at ? lo : -1;
}

int regc_program_unit_profile(const regc_program *p, regc_unit_profile *out)
{
    const regc_shard_layout *l = p->layout;
    if (!l || p->lazy || !p->instr_ms || p->measured_runs < 1)
        return regc_error(REGC_ERR_ARG, "unit profile: no measured flat ZeRO-3 program");
    memset(out, 0, (size_t)l->n_units * sizeof *out);
    const double runs = p->measured_runs;
    int current = -1;
    for (int i = 0; i < p->n_instr; i++) {
        const regc_instr *in = &p->instr[i];
        const double ms = p->instr_ms[i] / runs;
        const int frozen =
            (in->kernel == K_ALLGATHER || (in->kernel == K_COMM_WAIT && in->d[1] == K_ALLGATHER)) &&
            p->bufs[in->refs[1].buf].kind == BUF_FROZEN;
        if (frozen) {
            /* a frozen unit's gather: the layout's units are the trained */
        } else if (in->kernel == K_ALLGATHER) {
            const int u = unit_at(l, in->refs[1].off / (int64_t)sizeof(float));
            if (u >= 0)
                out[u].gather_ms += ms, out[u].gathers += 1.0;
            if (!in->signal) /* synchronous: waited for here */
                current = u;
        } else if (in->kernel == K_COMM_WAIT && in->d[1] == K_ALLGATHER) {
            current = unit_at(l, in->refs[1].off / (int64_t)sizeof(float));
        } else if (in->kernel != K_COMM_WAIT && in->kernel != K_REDUCE_SCATTER &&
                   in->kernel != K_ALLREDUCE && current >= 0) {
            out[current].compute_ms += ms;
        }
    }
    for (int u = 0; u < l->n_units; u++)
        if (out[u].gathers > 0)
            out[u].gather_ms /= out[u].gathers;
    return REGC_OK;
}
