/* ranks.c — a run over several processes: each rank's threads and
 * backend, the communicator its step's collectives run on, and the check
 * at start-up that every rank runs the same model on the same data with
 * the same settings and the same compiled program (a rank that differs
 * would enter other collectives, or the same ones in another order, and
 * the job would hang or compute garbage). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "options.h"
#include "trainer.h"

/* Threads of this rank: as asked, else OMP_NUM_THREADS, else its share of
 * the host's cores (ranks on one host must not oversubscribe it). */
int regc_trainer_threads(const regc_train_options *o, const regc_comm *c)
{
    if (o->threads > 0 || getenv("OMP_NUM_THREADS") || c->local_size <= 1)
        return o->threads;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long share = cores / c->local_size;
    return share > 1 ? (int)share : 1;
}

/* The communicator of the step's collectives (regc_communicator). */
int regc_trainer_open_step_comm(trainer *t, const regc_train_options *o)
{
    int cpu = !strcmp(t->be->name, "cpu");
    regc_communicator c = o->communicator;
    if (c == REGC_COMMUNICATOR_AUTO)
        c = cpu ? REGC_COMMUNICATOR_MPI
            : t->comm->size > 1 && t->comm->local_size <= regc_backend_cuda_device_count()
                ? REGC_COMMUNICATOR_NCCL
                : REGC_COMMUNICATOR_STAGED;
    switch (c) { /* the backend fits (regc_train_check_options) */
    case REGC_COMMUNICATOR_AUTO:
    case REGC_COMMUNICATOR_MPI: t->step_comm = t->comm; return REGC_OK;
    case REGC_COMMUNICATOR_STAGED:
        t->step_comm = t->own_step_comm = regc_comm_staged_new(t->comm, t->be);
        break;
    case REGC_COMMUNICATOR_NCCL:
        t->step_comm = t->own_step_comm = regc_comm_nccl_new(t->comm, t->be);
        break;
    }
    return t->step_comm ? REGC_OK : REGC_ERR_UNSUPPORTED;
}

/* The backend's name for this rank: ranks that share a host take its GPUs
 * in turn when "cuda" names none. */
const char *regc_trainer_rank_backend(const regc_train_options *o, const regc_comm *c, char *buf,
                                      size_t cap)
{
    const char *name = o->backend ? o->backend : "cpu";
    int gpus =
        strcmp(name, "cuda") == 0 && c->local_size > 1 ? regc_backend_cuda_device_count() : 0;
    if (gpus <= 0)
        return name;
    snprintf(buf, cap, "cuda:%d", c->local_rank % gpus);
    return buf;
}

/* What must agree across ranks beyond the run's state: the settings that
 * shape the step program, and the program itself (its collectives must be
 * the same, in the same order, on every rank). */
typedef struct {
    int zero_stage, level, regional, inline_back;
    char communicator[16]; /* the name of the step's */
    uint64_t program;      /* regc_program_hash */
    uint64_t schedule;     /* compile.schedule's bytes, hashed */
} rank_settings;

static int settings_differ(const rank_settings *a, const rank_settings *b, const char *b_is,
                           char *buf, size_t cap)
{
    static const char *const on_off[] = {"off", "on"};
    char sa[16], sb[16];
    snprintf(sa, sizeof sa, "%d", a->zero_stage), snprintf(sb, sizeof sb, "%d", b->zero_stage);
    const struct {
        const char *key, *a, *b;
    } fields[] = {
        {"zero_optimization.stage", sa, sb},
        {"compile.level", regc_level_name((regc_level)a->level),
         regc_level_name((regc_level)b->level)},
        {"compile.use_regional_compilation", on_off[a->regional != 0], on_off[b->regional != 0]},
        {"compile.inline_back", on_off[a->inline_back != 0], on_off[b->inline_back != 0]},
        {"zero_optimization.communicator", a->communicator, b->communicator},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (strcmp(fields[i].a, fields[i].b) != 0) {
            snprintf(buf, cap, "%s is %s on rank 0, %s %s", fields[i].key, fields[i].a, fields[i].b,
                     b_is);
            return 1;
        }
    if (a->schedule != b->schedule) {
        snprintf(buf, cap, "compile.schedule differs on rank 0 and %s", b_is);
        return 1;
    }
    if (a->program != b->program) {
        snprintf(buf, cap, "the compiled step program differs on rank 0 and %s (another regc?)",
                 b_is);
        return 1;
    }
    return 0;
}

/* compile.schedule as its text says it (no padding or bytes past a name). */
static uint64_t schedule_hash(const regc_replan_list *l)
{
    char text[REGC_MAX_REPLANS * (REGC_MAX_PASSES * (REGC_PASS_NAME + 12) + 24)];
    size_t n = 0;
    for (int k = 0; k < l->n && n < sizeof text; k++) {
        n += (size_t)snprintf(text + n, sizeof text - n, "%lld:", (long long)l->at[k].step);
        if (n < sizeof text) {
            regc_passes_to_text(&l->at[k].passes, text + n, sizeof text - n);
            n += strlen(text + n);
        }
        if (n < sizeof text)
            text[n++] = ';';
    }
    return regc_hash64(text, n < sizeof text ? n : sizeof text);
}

/* Every rank must run the same model on the same data with the same
 * settings: rank 0's state is broadcast and each rank compares its own. The
 * first rank that differs says how; rank 0 reports it, in one line, and the
 * other ranks fail with REGC_ERR_RANK (nothing more to print). */
int regc_trainer_check_ranks_agree(trainer *t, const regc_train_options *o)
{
    regc_comm *c = t->comm;
    if (c->size == 1)
        return REGC_OK;
    regc_run_state mine, first;
    rank_settings here_set = {o->zero_stage,
                              (int)o->compile.level,
                              o->compile.regional,
                              o->compile.inline_back,
                              "",
                              regc_program_hash(t->program),
                              schedule_hash(&o->replans)},
                  first_set;
    snprintf(here_set.communicator, sizeof here_set.communicator, "%s", t->step_comm->name);
    first_set = here_set;
    int rc = regc_run_state_of(o, t->model, t->tokens, 0, &mine);
    first = mine;
    if (rc || (rc = c->broadcast(c, &first, sizeof first, 0)) ||
        (rc = c->broadcast(c, &first_set, sizeof first_set, 0)))
        return rc;
    char what[512] = "", here[32];
    snprintf(here, sizeof here, "on rank %d", c->rank);
    int differ = regc_run_state_differ(&first, "on rank 0", &mine, here, 0, what, sizeof what) ||
                 settings_differ(&first_set, &here_set, here, what, sizeof what);
    /* the lowest rank that differs, or none */
    float *flags = calloc((size_t)c->size, sizeof *flags), flag = (float)differ;
    if (!flags)
        return regc_error(REGC_ERR_MEMORY, "out of memory");
    rc = c->allgather(c, flags, &flag, 1);
    int who = c->size;
    for (int r = c->size - 1; r >= 0 && rc == REGC_OK; r--)
        if (flags[r] != 0.0f)
            who = r;
    free(flags);
    if (rc || who == c->size)
        return rc;
    if ((rc = c->broadcast(c, what, sizeof what, who)))
        return rc;
    if (c->rank != 0) {
        regc_error_clear();
        return REGC_ERR_RANK;
    }
    return regc_error(REGC_ERR_ARG, "ranks disagree: %s", what);
}
