/* regc_region.h — the regional compiler: a model's training step
 * (forward, backward) compiled into one program of backend calls, and the
 * profile that times it.
 *
 * Pipeline: build the flat graph, detect the repeated layers, compile one
 * region per layer kind and per piece of glue (or the whole graph as one
 * region), lazy inline, inline back with the cross-layer passes and the
 * global memory plan; the compile cache short-cuts any of it. */
#ifndef REGC_REGION_H
#define REGC_REGION_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "regc_backend.h"
#include "regc_cache.h"
#include "regc_common.h"
#include "regc_graph.h"
#include "regc_models.h"
#include "regc_zero3.h"

/* ======================================================================
 * Compilation: the training step (forward, backward) as one program
 * ====================================================================== */
typedef enum {
    REGC_LEVEL_O0, /* op by op, no fusion, allocation at run time */
    REGC_LEVEL_O1, /* fusion, static memory plan, inline back with cross-layer passes */
    REGC_LEVEL_O2, /* O1 plus whole-step capture; on the CPU the same as O1 */
} regc_level;

/* compile.precision: what the step's arithmetic is done in. */
typedef enum {
    REGC_PRECISION_FP32, /* everything fp32 (the default) */
    /* mixed precision, as torch.autocast(dtype=torch.bfloat16) does it for
     * matrix products: every GEMM multiplies bf16-rounded operands with
     * fp32 sums; parameters, gradients, AdamW's moments, norms, softmax,
     * the loss and every reduction stay fp32 */
    REGC_PRECISION_BF16,
} regc_precision;

/* compile.recompute: which saved activations (what the forward keeps for
 * the backward) are dropped after the forward and computed again in the
 * backward by the same kernels from what is kept: the same bits in fewer
 * bytes, for more arithmetic. */
typedef enum {
    REGC_RECOMPUTE_NONE, /* keep every saved activation (the default) */
    /* keep GEMM and attention outputs; recompute what norms, activations and
     * elementwise chains make from them */
    REGC_RECOMPUTE_SELECTIVE,
    /* keep each layer's inputs only (Hugging Face's gradient checkpointing);
     * the glue around the layers as selective */
    REGC_RECOMPUTE_FULL,
    /* under budget_bytes: the cheapest recomputation, in FLOPs per byte
     * freed, from none up to full, that makes the step fit */
    REGC_RECOMPUTE_AUTO,
} regc_recompute;

/* The schedule passes a compile runs (compile.passes, or a step of
 * compile.schedule), in order, each with its own budget. */
#define REGC_MAX_PASSES 8
#define REGC_PASS_NAME 32 /* a name's bytes, terminator included */
typedef struct {
    int n;
    struct {
        char name[REGC_PASS_NAME];
        int64_t budget_bytes; /* device memory per rank; 0: the compile's budget_bytes */
    } pass[REGC_MAX_PASSES];
} regc_pass_list;

/* What one ZeRO-3 unit cost per step in the steps measured so far. */
typedef struct {
    double compute_ms; /* the instructions run while its parameters were the last gathered */
    double gather_ms;  /* one all-gather of it, on the communication thread */
    double gathers;    /* all-gathers of it per step */
} regc_unit_profile;

/* What one kernel cost per step in the steps measured so far: the
 * instructions of one label (regc_instr_label: the kernel, a GEMM's shape
 * and epilogue; a recomputation counted as its kernel), their time, and
 * their cost as compile.recompute counts it (FLOPs, one per element
 * touched outside GEMMs and attention). */
#define REGC_PROFILE_LABEL 96 /* a label's bytes, terminator included */
typedef struct {
    char label[REGC_PROFILE_LABEL];
    double ms;
    double cost;
} regc_kernel_cost;

typedef struct {
    int regional;             /* compile.use_regional_compilation (default 1) */
    regc_level level;         /* compile.level (default O1) */
    regc_precision precision; /* compile.precision (default fp32) */
    /* Under bf16, a tensor that only bf16 GEMMs read is held in bf16: half
     * its bytes, the same bits (the GEMM rounds it anyway); and a saved
     * activation autocast keeps in bf16 is rounded where it is made and
     * held so (region_bf16.c: the model's rounding, which changes bits).
     * 1 holds every tensor in fp32 instead: bf16 only in the GEMMs'
     * operands, and the memory the storage saves measured by. */
    int fp32_storage;
    /* compile.inline_back (default 1): stamp the compiled regions into one
     * flat step program; 0 runs the lazily-inlined program (prologue,
     * CALL(region, instance) ..., epilogue) directly, the reference for
     * inline back. O0 always runs lazily. */
    int inline_back;
    const char *dump_dir; /* compile.dump_graphs: NULL, or a directory */
    /* The compile cache (regc_cache_open), or NULL. With a cache, a step
     * compiled before loads whole, and a layer compiled before (for another
     * depth, say) loads instead of compiling. Dumps always compile. */
    regc_cache *cache;
    /* The target, part of every cache key: regc_backend's device ("cpu",
     * "cuda sm_90"); NULL is "cpu". */
    const char *device;
    /* The forward pass only (validation): no backward, no gradients, no
     * update; saved activations live only as long as the forward needs them. */
    int forward_only;
    /* Backward adds each parameter's gradient to what the gradient block
     * holds (gradient accumulation over micro-batches: the caller zeroes the
     * block before the first); 0: backward overwrites it. */
    int accumulate_grads;
    /* Data parallelism over `ranks` processes (<= 1: one). Stage 0: every
     * rank holds the whole model and its state, and the update first sums
     * the gradients over the ranks. Stage 3 (ZeRO-3): each rank holds its
     * shard of the parameters, gradients and AdamW's moments (the program's
     * shard layout); the program gathers each unit's parameters before use
     * and reduce-scatters its gradients into the shards. */
    int ranks, zero_stage;
    /* Stage 3, inlined back: how far ahead of its use a unit's all-gather
     * starts, in parameters in flight ahead of the compute (DeepSpeed's
     * stage3_prefetch_bucket_size), at least one unit; -n: n units ahead
     * (-1, one unit, is the default); 0: each gather where it is needed
     * (on demand). */
    int64_t prefetch_floats;
    /* Stage 3, inlined back: at most this many parameters gathered at once
     * (DeepSpeed's stage3_max_live_parameters): a gather starts only when
     * the unit computing and those gathered ahead of it, itself included,
     * stay within it, whatever prefetch_floats allows (a unit larger than it
     * is gathered where it is needed); 0: no limit. Units kept resident
     * (persistent, or a budget's choice) are not counted. */
    int64_t max_live_floats;
    /* Stage 3: a device-memory budget per rank in bytes (0: none). The
     * compiler then picks the prefetch depth and the units kept gathered
     * from forward to backward (smallest first: the highest gather cost
     * per byte) so that regc_program_device_memory's total fits, and fails
     * naming the least it needs when nothing does. */
    int64_t budget_bytes;
    /* Host memory per rank in bytes the step may hold (compile.host_memory_mb;
     * 0: no limit): the offloaded optimizer state and activations.
     * Offloading takes the largest activations that fit the room the
     * optimizer state leaves, the budget's search recomputing what the
     * device still cannot hold; a step that needs more is refused naming
     * both. */
    int64_t host_budget_bytes;
    /* Stage 3: units of at most this many parameters (DeepSpeed's
     * stage3_param_persistence_threshold, counted per unit: a layer's
     * parameters, a piece of glue's; a frozen unit by its bytes over 4, as
     * its layout counts it) stay gathered from their forward to their
     * backward, gathered once a step instead of twice; 0: none. A budget
     * keeps them too, and chooses among the larger ones. */
    int64_t persistence_floats;
    /* DeepSpeed's reduce_bucket_size: gradient elements reduced at a time.
     * Stage 0 over several ranks: the gradient block is all-reduced in
     * buckets of whole parameters of at most this many elements (one
     * larger is a bucket of its own), each started as soon as the backward
     * has written its last gradient (0: REGC_REDUCE_BUCKET_DEFAULT). Stage 3:
     * a unit's reduce-scatter is waited for once those started after it
     * reach this many elements (0: once the next one starts). */
    int64_t reduce_bucket_floats;
    /* compile.deepcompile (default 1): the collectives scheduled by the
     * schedule passes; 0: none runs, each collective waited for where it is
     * placed, stage 0's in the update */
    int deepcompile;
    /* compile.passes (default: prefetch, overlap_reduce, selective_gather;
     * see "Schedule passes" below) */
    regc_pass_list passes;
    /* What the steps measured so far cost, per unit of the shard layout
     * ([n_unit_profile], averaged over the ranks so that every rank
     * decides alike), or NULL: nothing measured yet. Not part of the cache
     * key: a re-planned step is keyed by its replan_step. */
    const regc_unit_profile *unit_profile;
    int n_unit_profile;
    /* What the steps measured so far cost per kernel ([n_kernel_cost],
     * averaged over the ranks), or NULL. With recompute auto under a
     * budget, a candidate's cost is then its kernels' measured time,
     * counted in FLOPs at the measured step's average rate (a kernel not
     * measured: its FLOPs), so that slow memory-bound kernels count as
     * what they cost. Not part of the step's cache key (keyed by
     * replan_step, as the unit profile); a region's key holds it. */
    const regc_kernel_cost *kernel_cost;
    int n_kernel_cost;
    /* the step of compile.schedule this compile re-plans at; 0: the first */
    int64_t replan_step;
    /* zero_optimization.offload_optimizer.device "cpu": AdamW's moments
     * (regc_program_memory's m and v, then host memory: the backend's
     * alloc_host) and a copy of the parameters live on the host, where the
     * update runs on a CPU backend; the gradients (after clipping's norm)
     * go there and the parameters come back. The same arithmetic, so the
     * same bits; on the CPU a placement only. */
    int offload_optimizer;
    /* compile.recompute (default auto, which recomputes nothing without
     * budget_bytes) */
    regc_recompute recompute;
    /* compile.offload_activation (DeepSpeed DeepCompile's key): inlined
     * back (O1, O2), every saved activation of at least 64 KiB whose
     * forward and backward lie far enough apart is copied to host memory
     * after its forward's last use and back before its backward's first,
     * on the backend's copy queue; the same bits in less device memory (at
     * O2 the step's run is then not captured) */
    int offload_activation;
    /* with offload_activation: at most this many saved activations
     * offloaded, the largest first; negative (the default): every one that
     * qualifies. Under budget_bytes with recompute auto, the compile finds
     * the fewest that fit (DeepCompile offloads only what must go). */
    int offload_limit;
    /* compile.logits_chunk_rows: the head's GEMM and its cross-entropy
     * in chunks of this many rows, forward and backward, so that neither
     * the logits nor their gradient is ever whole (the backward computes a
     * chunk's logits again); 0 (the default): whole, unless auto under a
     * budget chooses chunks */
    int64_t logits_chunk_rows;
    /* auto's choice: every saved activation whose recomputation costs at
     * most this many FLOPs per byte it frees is recomputed; negative: not
     * chosen yet (the compile searches for the least that fits, and the
     * step is keyed by the budget); a library user may set it to skip the
     * search */
    double recompute_ratio;
    /* Only whether the step can fit budget_bytes, what `regc plan --fit`
     * asks of every size it tries. Under recompute auto: the search's ends
     * only (compile_fit.c), *out left NULL, REGC_OK when one fits, else
     * REGC_ERR_BUDGET naming the least, the same answer as the search's;
     * the stats' fit_least holds the least they held. Otherwise *out is
     * the step with ZeRO-3's least schedule (no prefetch, nothing kept
     * gathered beyond the persistent units), whatever it holds, for the
     * caller to weigh. Never cached. */
    int fit_check;
} regc_compile_options;

/* Stage 0's buckets when reduce_bucket_floats is 0: 25 MiB of fp32, as
 * PyTorch's DistributedDataParallel (bucket_cap_mb) */
#define REGC_REDUCE_BUCKET_DEFAULT (INT64_C(25) << 18)

void regc_compile_options_default(regc_compile_options *o);
/* The names of the levels ("O0", "O1", "O2"), the precisions ("fp32",
 * "bf16") and the recompute levels ("none", "selective", "full", "auto"),
 * in their enums' order, NULL-terminated. */
extern const char *const regc_level_names[];
extern const char *const regc_precision_names[];
extern const char *const regc_recompute_names[];
/* a name -> its enum value, or -1 */
int regc_level_from_name(const char *name);
int regc_precision_from_name(const char *name);
/* an enum value -> its name, "?" when out of range */
const char *regc_level_name(regc_level l);
const char *regc_precision_name(regc_precision p);
const char *regc_recompute_name(regc_recompute r);

/* What compiling a step cost and gave. */
typedef struct {
    double build_ms;           /* the flat forward graph */
    double detect_ms;          /* block detection (0 for full compilation) */
    double compile_ms;         /* regions: extract, differentiate, passes, lowering, local plans */
    double inline_ms;          /* lazy inline, inline back, cross-layer passes, global plan */
    int region_kinds;          /* distinct repeated layers found */
    int region_compiles;       /* regions compiled: one per kind, or 1 for the whole graph */
    int glue_compiles;         /* prologue, epilogue and the glue between runs */
    int instances;             /* calls of compiled layers per pass */
    int add_norm_fusions;      /* residual add + next norm pairs fused across layers */
    int64_t n_instructions;    /* of the step program (forward + backward) */
    int64_t peak_bytes;        /* of the activation memory plan (0 at O0) */
    int64_t lower_bound_bytes; /* the most bytes live at any program point */
    int memory_aware_order;    /* 1: the reordered program had the lower peak and was kept */
    int cache_hits;            /* compile-cache entries used: the step, or regions */
    int cache_misses;          /* looked up, not usable, compiled and stored */
    double cache_ms;           /* keying, reading and decoding cache entries */
    /* ZeRO-3's schedule: the prefetch (as prefetch_floats), the units kept
     * gathered from forward to backward, of how many (the frozen
     * parameters' units counted with the others) */
    int64_t zero3_prefetch;
    int zero3_resident, zero3_units;
    int64_t replan_step; /* compile.schedule's step this compile re-planned at; 0: the first */
    /* compile.memory_budget_mb's search (compile.recompute auto): the
     * compiles it tried before the one kept, and their time (not in the
     * fields above, which are the kept compile's) */
    int fit_probes;
    double fit_ms;
    /* with fit_check under recompute auto: the least device bytes per rank
     * its compiles held (when one fits, the least before it stopped); -1
     * when none could say */
    int64_t fit_least;
    /* kernels whose measured cost ranked auto's recomputation (kernel_cost) */
    int measured_kernels;
} regc_compile_stats;

/* ======================================================================
 * Schedule passes (DeepCompile's register_compile_pass and schedule).
 *
 * Lowering places every collective of a multi-rank step where it is
 * needed and waits for it there (each all-gather right before the pass
 * that reads its unit, each reduce-scatter after its unit's last gradient,
 * stage 0's all-reduces in the update): always right, never fast. When
 * they start, how far ahead, and which units stay gathered from forward to
 * backward is a regc_comm_schedule, decided by the passes compile.passes names,
 * run in order: each sees the options, its budget and the profile of the
 * steps measured so far, may change what the ones before it chose, and may
 * weigh a candidate by linking it (regc_pass_try). The step is then
 * linked with the result. compile.schedule re-plans a running job: at a
 * listed step the trainer compiles the step again with that step's passes
 * and the profile measured since the last plan.
 *
 * Built in:
 *  - "prefetch": all-gathers started ahead: compile.prefetch_floats, or
 *    with a profile (and no explicit prefetch) the fewest units ahead whose
 *    measured compute covers every measured all-gather;
 *  - "overlap_reduce": reduce-scatters (stage 3) and stage 0's bucket
 *    all-reduces started in the backward and waited for later;
 *  - "selective_gather": under a budget, the deepest prefetch (4, 2, 1 or
 *    0 units ahead, none when no pass before it prefetches) that fits, then
 *    the most units kept gathered that fit, the highest gather cost per
 *    byte first (measured, or the smallest units first without a profile),
 *    then in what remains the most frozen units, smallest first; fails
 *    naming the least the step needs when nothing fits.
 * ====================================================================== */
typedef struct regc_program regc_program;
typedef struct regc_device_memory regc_device_memory;

typedef struct {
    int64_t prefetch_floats;      /* as compile.prefetch_floats; 0: on demand */
    int64_t max_live_floats;      /* as compile.max_live_floats */
    int64_t reduce_bucket_floats; /* as compile.reduce_bucket_floats */
    int overlap;                  /* reduce collectives overlapped with the backward */
    unsigned char *resident;      /* [n_units] kept gathered from forward to backward */
    /* [frozen units] the same for the frozen parameters' units (a LoRA
     * model's base, in their own layout); NULL: none kept */
    unsigned char *frozen_resident;
} regc_comm_schedule;

typedef struct regc_pass_link regc_pass_link;
typedef struct {
    const regc_compile_options *options;
    const regc_shard_layout *layout;        /* stage 3's units, or NULL */
    const regc_unit_profile *profile;       /* [layout->n_units], or NULL: none measured */
    int64_t budget_bytes;                   /* this pass's device memory per rank; 0: none */
    regc_pass_link *link;                   /* for regc_pass_try */
    const regc_shard_layout *frozen_layout; /* the frozen parameters' units, or NULL */
} regc_pass_input;

typedef int (*regc_pass_fn)(const regc_pass_input *in, regc_comm_schedule *s, void *user);
/* The least device memory per rank o asks the step to fit: budget_bytes
 * or a pass's own budget, whichever is smaller; 0: none. */
int64_t regc_compile_least_budget(const regc_compile_options *o);
/* Add a pass (or replace the one of that name) for every later compile;
 * REGC_ERR_ARG for a bad name or a full registry. Not thread-safe: register
 * before compiling. */
int regc_pass_register(const char *name, regc_pass_fn fn, void *user);
/* Is a pass of this name registered? */
int regc_pass_known(const char *name);
/* Link the step with schedule s and give what it would hold per rank. */
int regc_pass_try(const regc_pass_input *in, const regc_comm_schedule *s, regc_device_memory *mem);
/* A program that ran (with measuring on) into its kernels' costs, one row
 * per label in the order the program first runs them (the same on every
 * rank of one program): *out malloc'd, [*n]. */
int regc_program_kernel_costs(const regc_program *p, regc_kernel_cost **out, int *n);

/* A program that ran (with measuring on) into its units' profile: out
 * [layout's n_units], per step; REGC_ERR_ARG without units or measures. */
int regc_program_unit_profile(const regc_program *p, regc_unit_profile *out);
/* O2 on a backend that captures (CUDA): the milliseconds spent capturing
 * the step and its update into graphs, over every run so far. */
double regc_program_capture_ms(const regc_program *p);
/* Time every instruction of the flat program from now on (on) or stop. */
int regc_program_measure(regc_program *p, int on);

/* ======================================================================
 * Profile: where the time of a run goes, summed per row (a kernel and its
 * shape) and reported per run, largest first.
 * ====================================================================== */
typedef struct regc_profile regc_profile;
regc_profile *regc_profile_new(void); /* NULL when out of memory (error set) */
void regc_profile_free(regc_profile *pr);
/* Add one call of ms to the row named label; flop > 0 counts the row's
 * arithmetic (GEMMs), reported as GFLOP/s. */
int regc_profile_add(regc_profile *pr, const char *label, double ms, double flop);
void regc_profile_count_run(regc_profile *pr);
int regc_profile_runs(const regc_profile *pr);
/* Rows in the order they were first added; ms, flop and calls summed over
 * every run. */
int regc_profile_n_rows(const regc_profile *pr);
const char *regc_profile_row(const regc_profile *pr, int i, double *ms, double *flop, long *calls);
/* The table: ms per run, share, calls per run, GFLOP/s, label; then the total. */
int regc_profile_write(const regc_profile *pr, FILE *f);

/* A compiled training step: forward, backward, parameter gradients into
 * the gradient block. */
typedef struct regc_program regc_program;

/* Build m's graph for [batch, seq], then compile it as o says. Shapes only:
 * m needs no weights. */
int regc_program_compile(const regc_model *m, int64_t batch, int64_t seq,
                         const regc_compile_options *o, regc_program **out,
                         regc_compile_stats *stats);
/* Compile a flat forward graph whose first output is a scalar loss, as o
 * says; g is taken (freed on failure too). Its parameters lie in the
 * parameter and gradient blocks in tensor order, each one's floats after
 * the previous one's. */
int regc_program_compile_graph(regc_graph *g, const regc_compile_options *o, regc_program **out,
                               regc_compile_stats *st);
/* A compile-cache entry's payload checked as a compile checks it before
 * use (canon: the canonical form it is keyed on, which says whether it
 * holds a region or a step; a key no compile makes is not checked):
 * REGC_OK, or REGC_ERR_FORMAT with the reason. `regc cache verify` runs it
 * on every entry of this build. */
int regc_compile_check_entry(const void *canon, size_t canon_len, const void *payload, size_t len);
void regc_program_free(regc_program *p);
/* The graph inputs the step reads, in tensor order (as regc_model_fill_inputs fills them). */
int regc_program_n_inputs(const regc_program *p);
const regc_tensor *regc_program_input(const regc_program *p, int i);
/* The floats of each parameter-shaped block the program runs over: the
 * model's total_numel, or under ZeRO-3 this rank's shard of it. */
int64_t regc_program_block_floats(const regc_program *p);
/* ZeRO-3's layout of the blocks (units, shards, where each parameter lies),
 * or NULL when every rank holds the whole model. */
const regc_shard_layout *regc_program_shard_layout(const regc_program *p);
/* ZeRO-3's layout of the frozen block, in 4-byte words of the bytes its
 * parameters are held in, or NULL (no layout, or nothing frozen). */
const regc_shard_layout *regc_program_frozen_layout(const regc_program *p);
/* A step's communication, per rank, from the program alone. */
typedef struct {
    int units;               /* ZeRO-3's gather units; 0 without */
    int frozen_units;        /* ... of the frozen block, gathered too (never scattered) */
    int gathers, scatters;   /* all-gathers and reduce-scatters per step */
    int64_t gather_bytes;    /* received per step: (N - 1) / N of every gathered unit */
    int64_t scatter_bytes;   /* sent per step: (N - 1) / N of every unit's gradients */
    int64_t allreduce_bytes; /* sent per step by a ring all-reduce: 2 (N - 1) / N */
    int64_t window_bytes;    /* the most gathered parameters held at once */
} regc_comm_plan;
void regc_program_comm_plan(const regc_program *p, regc_comm_plan *c);
/* What a run holds on its device, per rank, for a program: the four
 * parameter-shaped blocks the trainer allocates (ZeRO-3: shards), the
 * program's activation arena, a batch's inputs and the scalar block. Known
 * from the program alone, so `regc plan` predicts it without devices. */
typedef struct regc_device_memory {
    int64_t params, grads, m, v; /* the four parameter-shaped blocks */
    int64_t frozen;          /* the frozen parameters' block (under ZeRO-3, this rank's shard) */
    int64_t model_floats;    /* floats of the whole model */
    int64_t block_floats;    /* of each block: the model, or this rank's padded shard */
    int64_t activations;     /* the step's arena (gathered units included) */
    int64_t inputs, scalars; /* a batch's inputs; the optimizer's scalar block */
    int64_t total;
    /* host memory, not in total: offload_optimizer's (m and v, the
     * parameters' copy, the gradients' and scalars' landing places; m and
     * v are then 0 above) and offload_activation's (each offloaded
     * activation's place) */
    int64_t host;
    int64_t host_activations; /* offload_activation's part of host */
} regc_device_memory;
void regc_program_device_memory(const regc_program *p, regc_device_memory *a);
/* The bytes of the frozen block the program reads (0: none). */
int64_t regc_program_frozen_bytes(const regc_program *p);
/* What a program does to fit its device, per step: compile.recompute's
 * replays, compile.logits_chunk_rows's chunks, compile.offload_activation's
 * copies. */
typedef struct {
    int replays;        /* instructions the backward runs again */
    double replay_flop; /* their FLOPs (elementwise kernels: one per element touched) */
    double step_flop;   /* the same count over the whole forward and backward */
    char kernels[200];  /* which, most first: "layernorm 24, gemm 12, ..." */
    /* the loss's chunks and the rows of the largest (0, 0: the logits whole) */
    int64_t logits_chunks, logits_chunk_rows;
    int offloaded;         /* activations moved to the host and back */
    int64_t offload_bytes; /* their bytes, each way */
} regc_fit_plan;
void regc_program_fit_plan(const regc_program *p, regc_fit_plan *out);
/* The asynchronous collectives over every run so far: the time the
 * communication queue spent in them, and the time the program blocked
 * waiting for them (what was not hidden behind compute). */
void regc_program_comm_times(const regc_program *p, double *busy_ms, double *wait_ms);
/* The device memory a program runs over. The four blocks hold every
 * parameter in the model's order (llm.c's layout), [total_numel] each, or
 * under ZeRO-3 this rank's shard of every unit (regc_program_block_floats);
 * grads, m and v may be NULL for a forward-only program, m and v for a
 * program that is never updated. scalars NULL: bind allocates a block of
 * its own with loss_scale 1 (enough to run forward and backward). */
typedef struct {
    float *params, *grads, *m, *v;
    /* the frozen parameters (regc_tensor's `frozen`), in the model's order
     * after the trainable ones; NULL where the model has none */
    const void *frozen;
    regc_step_scalars *scalars;
    void *const *inputs; /* one buffer per program input */
    /* the ranks' communicator (NULL: one process); a program compiled for
     * several ranks needs one of their number */
    regc_comm *comm;
    /* optional: activation memory to borrow (another program's arena,
     * when the two never run at the same time); used when large enough,
     * else the program allocates its own */
    void *arena;
    int64_t arena_bytes;
    /* optional: the compile cache the program came from, where the
     * backend's tuning (cuBLASLt's algorithms) is kept beside the step,
     * under the device's name: loaded before the program's GEMMs are
     * prepared, stored when preparing chose anything new */
    regc_cache *tuning_cache;
    /* offload_optimizer: the CPU backend the update runs on (the caller's,
     * sized for its share of the cores), or NULL: be itself on the CPU, a
     * CPU backend of the program's own beside a GPU */
    regc_backend *host;
    /* optional: ranges [no_decay[2k], no_decay[2k + 1]) of the parameter
     * block, in floats, ascending and disjoint, whose parameters AdamW
     * does not decay (a parameter group of weight_decay 0: biases and norm
     * weights, as Transformers' Trainer groups them); the rest decays.
     * Copied by bind. */
    const int64_t *no_decay;
    int n_no_decay;
} regc_program_memory;

/* Bind device memory; allocates the activation arena on be (unless it
 * borrows mem->arena). */
int regc_program_bind(regc_program *p, regc_backend *be, const regc_program_memory *mem);
/* The activation arena the program plans (O0: none; it allocates per
 * buffer at run time). */
int64_t regc_program_arena_bytes(const regc_program *p);
/* The arena a bound program allocated (NULL, 0 when it has none of its own). */
void *regc_program_arena(const regc_program *p, int64_t *bytes);
/* Run forward and backward: the parameters' gradients land in the gradient
 * block (overwriting it, or added to it when compiled with
 * accumulate_grads), the loss's gradient seeded with the scalar block's
 * loss_scale. A forward-only program runs forward. */
int regc_program_run(regc_program *p);
/* The optimizer step: the schedule, the gradients' global norm and clip
 * (when the scalar block's max_grad_norm > 0), AdamW over every parameter;
 * the scalar block's state advances by one step, unless the norm is not
 * finite: then nothing changes but its `skipped` flag. */
int regc_program_update(regc_program *p);
/* Time every instruction of the runs that follow into pr (the backend
 * synchronises after each one), or stop timing (NULL). pr is borrowed. */
void regc_program_set_profile(regc_program *p, regc_profile *pr);
/* Device pointer of the loss after a run. */
const float *regc_program_loss(const regc_program *p);
/* A hash of the whole step program (what the compile cache stores): two
 * processes with the same hash run the same instructions and collectives. */
uint64_t regc_program_hash(const regc_program *p);
/* Write the step program as text (instructions and buffers). */
void regc_program_dump(const regc_program *p, FILE *f);

#endif
