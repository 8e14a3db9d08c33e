/* program.h — private to region/: instructions, compiled regions and the
 * step program.
 *
 * An instruction is one backend call with its sizes decided at compile
 * time. Its operands are references (buffer, byte offset): inside a
 * compiled region the buffer is a region-local slot; in a step program it
 * is a program buffer (an arena allocation, a parameter's or gradient's
 * place in the model's blocks, or a graph input). A compiled region is
 * bound to an instance by a table from slots to program references; inline
 * back copies the region's instructions through that table. */
#ifndef REGC_PROGRAM_H
#define REGC_PROGRAM_H

#include <stdio.h>

#include "regc_detect.h"
#include "regc_region.h"
#include "regc_zero3.h"

/* ---------------------------------------------------------------- instructions */

typedef enum {
    K_FILL,        /* out; f = value; d0 = n */
    K_COPY,        /* out, x; d0 = bytes */
    K_COPY_2D,     /* dst, src; d0 = rows, d1 = cols, d2 = ld_dst, d3 = ld_src */
    K_TRANSPOSE,   /* out, x; d0 = ndim, shape in d[1..], perm */
    K_GEMM,        /* c, a, b, bias, aux, bias_grad; see flags */
    K_EMBED_FWD,   /* out, ids, table; d0 = rows, d1 = cols */
    K_EMBED_BWD,   /* dtable, ids, dout; d0 = rows, d1 = cols, d2 = vocab, d3 = 1 + the padding
                      id (0: none); accumulate */
    K_ADD,         /* out, a, b; d0 = n */
    K_BIAS_ADD,    /* out, x, b; d0 = rows, d1 = cols */
    K_SUM_ROWS,    /* out, x; d0 = rows, d1 = cols */
    K_LN_FWD,      /* y, mean, rstd, x, w, b; d0 = rows, d1 = cols; f = eps */
    K_LN_BWD,      /* dx, dw, db, dy, x, w, mean, rstd; d0 = rows, d1 = cols */
    K_RMS_FWD,     /* y, rstd, x, w; d0 = rows, d1 = cols; f = eps */
    K_RMS_BWD,     /* dx, dw, dy, x, w, rstd */
    K_ROPE,        /* y, x, cos, sin; d0 = batch, d1 = t, d2 = n_head, d3 = head_dim, d4 = inverse,
                      d5 = the rotated part of a head (head_dim, or Phi's and GPT-NeoX's first part) */
    K_UNARY,       /* y, x; d0 = n; unary = which (gelu, silu, ...); f = SCALE's value */
    K_BINARY,      /* out, a, b; d0 = n; unary = which (mul or an elementwise backward) */
    K_ATTN_FWD,    /* out, lse, q, k, v, bias, site, draw, doc_start; f = the dropout's p */
    K_ATTN_BWD,    /* dq, dk, dv, dbias, dout, q, k, v, bias, out, lse, site, draw, doc_start */
    K_CE_FWD,      /* loss, lse, logits, targets; d0 = rows, d1 = cols */
    K_CE_BWD,      /* dlogits, dloss, logits, targets [d3], lse; d0 = rows, d1 = cols, d2 = the
                      first row's index in targets, d3 = the loss's rows */
    K_ROW_SUM,     /* out, x; d0 = rows, d1 = cols, d2 = mean (else the sum) */
    K_SOFTMAX,     /* y, lse, x; d0 = rows, d1 = cols, d2 = log (log-softmax) */
    K_EW,          /* fused elementwise: outs then ins; ew program; d0 = n */
    K_ADD_LN_FWD,  /* sum, y, mean, rstd, a, b, w, bias; d0 = rows, d1 = cols; f = eps */
    K_ADD_RMS_FWD, /* sum, y, rstd, a, b, w */
    K_LN_BWD_ADD,  /* dx, dw, db, dres, dy, x, w, mean, rstd */
    K_RMS_BWD_ADD, /* dx, dw, dres, dy, x, w, rstd */
    K_DROPOUT,     /* y, x, site, draw; d0 = n; f = p */
    /* the loss over logits taken in chunks of rows (chunk.c) */
    K_CE_ROWS,                 /* lse, picked, logits, targets; d0 = rows, d1 = cols */
    K_CE_LOSS,                 /* loss, lse, picked, targets; d0 = rows, d1 = cols */
    K_REGION_LAST = K_CE_LOSS, /* the kernels an instruction of a region may run */
    /* the optimizer step (the program's update phase), over the scalar block */
    K_STEP_SCHEDULE, /* scalars */
    K_GRAD_SUMSQ,    /* scalars, g; d0 = n */
    K_GRAD_CLIP,     /* scalars */
    K_ADAMW,         /* param, m, v, g, scalars; d0 = n (offloaded: on the host) */
    K_COPY_D2H,      /* host dst, device src; d0 = bytes; signal k: on the copy queue */
    K_COPY_H2D,      /* device dst, host src; d0 = bytes; signal k: on the copy queue */
    /* collectives, run on the program's communicator */
    K_ALLREDUCE,      /* buf; d0 = n, d1 = 0: f32, 1: f64; the sum over ranks, in place */
    K_ALLGATHER,      /* dst [ranks x d0], src [d0]: a unit's shards gathered whole */
    K_REDUCE_SCATTER, /* dst [d0], src [ranks x d0]; accumulate: dst (+)= the ranks' sum */
    K_COMM_WAIT,      /* the refs of collective or copy `signal`; d1: its kernel. Waits for it */
    K_COUNT
} regc_kernel;

#define REGC_INSTR_MAX_REFS 14 /* bf16_refs has a bit for each */

/* How a region's formal parameter is held (regc_region_spec's in_held;
 * compile.c's held_param): 0 in fp32. */
typedef enum {
    REGC_HELD_BF16 = 1, /* in bf16: read by bf16 GEMMs (and all-gathers) alone */
    REGC_HELD_NF4,      /* in NF4: the B of fp32 GEMMs alone */
    REGC_HELD_NF4_BF16, /* in NF4: the B of bf16 GEMMs alone */
} regc_held;
#define REGC_REF_NONE (-1) /* an absent operand (no bias, no aux) */

typedef struct {
    int32_t buf; /* slot or program buffer; REGC_REF_NONE when absent */
    int64_t off; /* bytes */
} regc_ref;

typedef struct {
    uint8_t kernel; /* regc_kernel */
    uint8_t n_refs;
    uint8_t n_out; /* refs[0 .. n_out-1] are written, the rest read */
    uint8_t unary; /* K_UNARY / K_BINARY: the regc_op computed */
    regc_ref refs[REGC_INSTR_MAX_REFS];
    int64_t d[REGC_MAX_DIMS + 1];
    float f;
    int trans_a, trans_b, epilogue, accumulate; /* K_GEMM; accumulate also K_EMBED_BWD */
    int bf16;                                   /* K_GEMM: bf16 operands (regc_gemm's) */
    /* bit k: refs[k] is held in bf16 (half the bytes; its offset counts
     * them), where regc_instr_bf16_allowed says the kernel can */
    uint16_t bf16_refs;
    uint8_t b_nf4;           /* K_GEMM: B (refs[2]) is a frozen weight held in NF4 (regc_gemm's) */
    regc_attn_shape attn;    /* K_ATTN_* */
    int perm[REGC_MAX_DIMS]; /* K_TRANSPOSE */
    const regc_ew_program *ew; /* K_EW, owned by the compiled region */
    int node;                  /* region node it came from (dumps) */
    /* collectives: 0 runs at once; k > 0 starts asynchronous collective k
     * on the communication queue, finished by the K_COMM_WAIT of signal k */
    int signal;
    /* a forward instruction run again in the backward (compile.recompute):
     * counted apart in plans, dumps and profiles */
    uint8_t replay;
} regc_instr;

const char *regc_kernel_name(regc_kernel k);
static inline int regc_instr_ref_bf16(const regc_instr *in, int k)
{
    return (in->bf16_refs >> k) & 1;
}
/* May operand k of the instruction be held in bf16? A bf16 GEMM's A and B,
 * and C when it does not accumulate; the norms' y; a fused chain's
 * outputs; the cross-entropy's dlogits: the kernels that read or write a
 * bf16 tensor (kernels/regc_backend.h); and an all-gather's destination
 * (ZeRO-3's units gathered in bf16, program_run.c). */
int regc_instr_bf16_allowed(const regc_instr *in, int k);
/* One instruction through a backend, operands already resolved to device
 * pointers (ptr[i] for refs[i], NULL when absent); not the collectives and
 * AdamW, which run through their program (program_run.c: the
 * communicator, the undecayed ranges). */
int regc_instr_run(regc_backend *be, const regc_instr *in, void *const *ptr);
/* The GEMM descriptor of a K_GEMM instruction over resolved operands. */
void regc_instr_gemm(const regc_instr *in, void *const *ptr, regc_gemm *g);
void regc_instr_dump(const regc_instr *in, FILE *f);
/* Its kernel and, for GEMMs, epilogue and shape: a dump's or profile's name. */
void regc_instr_label(const regc_instr *in, char *buf, size_t size);
/* Arithmetic counted for GFLOP/s: 2mnk for a GEMM, 0 otherwise. */
double regc_instr_flop(const regc_instr *in);
/* A copy on the copy queue, or the wait for one (offload.c)? */
static inline int regc_instr_is_queued_copy(const regc_instr *in)
{
    const int k = in->kernel == K_COMM_WAIT ? (int)in->d[1] : in->kernel;
    return (k == K_COPY_D2H || k == K_COPY_H2D) && in->signal > 0;
}
/* Does the instruction write operand k? */
int regc_instr_writes(const regc_instr *in, int k);
/* The operand whose memory output 0 may take over (an elementwise
 * instruction reading it at the same index), or -1. */
int regc_instr_inplace_input(const regc_instr *in);

/* ---------------------------------------------------------------- compiled regions */

typedef enum {
    SLOT_IN,    /* formal input k: a program value */
    SLOT_OUT,   /* formal output k: a program value */
    SLOT_DOUT,  /* incoming gradient of output k */
    SLOT_SEED,  /* gradient of input k accumulated by later readers */
    SLOT_DIN,   /* gradient of input k after this region's contributions */
    SLOT_SAVED, /* written by forward, read by backward: kept per instance */
    SLOT_TEMP,  /* lives within one forward or one backward pass */
} regc_slot_kind;

typedef struct {
    regc_slot_kind kind;
    int index; /* formal index for IN, OUT, DOUT, SEED, DIN */
    int64_t bytes;
    int alias; /* -1, or the slot this one is a view of (at byte offset alias_off) */
    int64_t alias_off;
    int64_t offset; /* SAVED: in the instance's saved block; TEMP: in the region's scratch */
    int tensor;     /* region graph tensor (dumps) */
    int bf16;       /* held in bf16: bytes are half the tensor's (region_bf16.c) */
} regc_slot;

/* compile.recompute as one region applies it (recompute.c). */
typedef struct regc_recompute_policy {
    regc_recompute mode; /* AUTO: drop what costs at most `ratio` */
    int layer;           /* FULL: a layer (glue recomputes as SELECTIVE) */
    double ratio;        /* AUTO: cost (FLOPs, or measured) per byte freed */
    /* AUTO: measured kernel costs ([n_costs], or none) and their average
     * rate (regc_kernel_cost_rate) */
    const regc_kernel_cost *costs;
    int n_costs;
    double rate;
} regc_recompute_policy;

/* A whole-graph region's keep[] values: what a layer region would do with
 * the tensor. */
typedef enum {
    REGC_KEEP_LAYER = 0,  /* inside a layer: the policy as for a layer */
    REGC_KEEP_ALWAYS = 1, /* a layer's boundary: never recomputed */
    REGC_KEEP_GLUE = 2,   /* made by the glue: FULL recomputes it as SELECTIVE */
} regc_keep;

/* What a region is compiled from: n_nodes graph nodes (an instance in a
 * valid order), its formal inputs (tensors read from outside) and outputs
 * (tensors read outside or graph outputs). */
typedef struct {
    int n_nodes;
    const int *nodes;
    int n_in, n_out;
    const int *in;             /* [n_in] graph tensors */
    const int *out;            /* [n_out] graph tensors */
    const char *in_needs_grad; /* [n_in] */
    const char *in_seeded;     /* [n_in] a later reader accumulates its gradient first */
    const char *out_has_grad;  /* [n_out] receives an incoming gradient */
    /* [n_in] or NULL: how a formal parameter is held where not in fp32
     * (regc_held): gathered in bf16 (ZeRO-3 under bf16, region_bf16.c) or
     * frozen in bf16 or NF4; its slot holds that many bytes */
    const char *in_held;
    const char *name; /* "layer kind 0", "glue 1", "step" */
    /* compile.recompute for this region (recompute.c), or NULL: none */
    const regc_recompute_policy *recompute;
    /* [graph tensors] or NULL: inside a whole-graph region, which tensors
     * recompute how (regc_keep: the layers' boundaries never, the glue's
     * as a glue region's) */
    const char *keep;
    /* compile.logits_chunk_rows: the head and its loss in chunks of this
     * many rows (chunk.c); 0: whole */
    int64_t logits_chunk_rows;
} regc_region_spec;

typedef struct {
    char *name;
    regc_graph *graph; /* the region graph: formals, forward and backward nodes */
    int n_fwd_nodes;
    int n_in, n_out;
    int n_slots;
    regc_slot *slots;
    int *in_slot, *out_slot, *dout_slot, *seed_slot, *din_slot; /* per formal, -1 if none */
    int n_fwd, n_bwd;
    regc_instr *fwd, *bwd;
    int n_ew, ew_cap;
    regc_ew_program *ew;   /* fused chains, pointed to by instructions: [ew_cap] */
    int64_t saved_bytes;   /* per instance */
    int64_t scratch_bytes; /* temporaries of one pass, planned */
    /* compile.recompute auto: every candidate's FLOPs per byte freed, for
     * the compile's search (not kept in the cache: NULL when loaded) */
    int n_recompute_ratios;
    double *recompute_ratios;
} regc_compiled_region;

/* Extract, differentiate, optimise (per level) and lower one region. */
/* Instruction i of a region's forward then backward lists, i < n_fwd + n_bwd:
 * a pass over both in one loop. */
static inline regc_instr *regc_region_instr(const regc_compiled_region *r, int i)
{
    return i < r->n_fwd ? &r->fwd[i] : &r->bwd[i - r->n_fwd];
}

/* precision: compile.precision (bf16: every GEMM multiplies bf16
 * operands); bf16_storage: then also hold in bf16 what only those GEMMs
 * read (region_bf16.c). */
int regc_region_compile(const regc_graph *g, const regc_region_spec *spec, regc_level level,
                        regc_precision precision, int bf16_storage, regc_compiled_region **out);
void regc_compiled_region_free(regc_compiled_region *r);
void regc_compiled_region_dump(const regc_compiled_region *r, FILE *f);

/* ---------------------------------------------------------------- step programs */

typedef enum {
    BUF_ARENA,   /* planned activation memory (O1) or allocated at run time (O0) */
    BUF_PARAMS,  /* the parameter block at `offset` */
    BUF_GRADS,   /* the gradient block at `offset` */
    BUF_INPUT,   /* graph input number `offset` */
    BUF_M,       /* AdamW's first moments at `offset` (a block like the parameters') */
    BUF_V,       /* AdamW's second moments at `offset` */
    BUF_SCALARS, /* the step's regc_step_scalars, at byte `offset` */
    BUF_HOST,    /* the program's own host memory (an offloaded update's), bytes long */
    BUF_FROZEN,  /* the frozen block (parameters never trained) at `offset` */
} regc_buf_kind;

typedef struct {
    regc_buf_kind kind;
    int64_t bytes;
    int64_t offset;  /* arena offset (planned), block offset, or input number */
    int first, last; /* program points of first write and last use */
    int inplace_of;  /* planner hint, -1 if none */
    /* O0 with offload_activation (offload.c's regc_offload_lazy): the lazy
     * step after which it leaves for host memory and the one before which
     * it comes back; -1: it stays */
    int away, back;
} regc_buf;

/* A buffer with nothing planned yet: no lifetime, no in-place hint, not
 * offloaded. */
static inline regc_buf regc_buf_unplanned(regc_buf_kind kind, int64_t bytes, int64_t offset)
{
    return (regc_buf){.kind = kind,
                      .bytes = bytes,
                      .offset = offset,
                      .first = -1,
                      .last = -1,
                      .inplace_of = -1,
                      .away = -1,
                      .back = -1};
}

/* A call of a compiled region's forward or backward on one instance: slot s
 * is program reference bind[s]. */
typedef struct {
    int region; /* index into the program's regions */
    int backward;
    regc_ref *bind; /* [n_slots] */
} regc_call;

/* One piece of the step: an instance of a compiled region. */
typedef struct {
    int region;
    int *in, *out; /* [n_in], [n_out] graph tensors bound to the formals */
    int saved_buf; /* lazy: this instance's saved block */
} piece;

/* A lazy step: a call, or a program-level instruction (gradient seeds). */
typedef struct {
    int piece; /* -1: instr */
    int backward;
    regc_ref *bind; /* [n_slots] of the region, for calls */
    regc_instr instr;
} lazy_step;

/* The step program; region/serial.c reads and writes it whole. It has two
 * phases: the gradients' (forward and backward: the flat instructions, or
 * the lazy steps) and the update (the optimizer step: `update`). */
struct regc_program {
    regc_level level;
    int lazy;
    int forward_only;             /* compile.forward_only: no backward, no update */
    int accumulate_grads;         /* backward adds into the gradient block */
    int ranks, zero_stage;        /* compile.ranks, zero_optimization.stage */
    int n_signals;                /* asynchronous collectives, numbered from 1 */
    int64_t prefetch_floats;      /* compile.prefetch_floats, or the budget's choice */
    int64_t max_live_floats;      /* compile.max_live_floats */
    int64_t reduce_bucket_floats; /* compile.reduce_bucket_floats */
    int overlap;                  /* the schedule's: reduce collectives overlap the backward */
    double *instr_ms;             /* [n_instr] measured times summed over the runs, or NULL */
    int measured_runs;
    int *started_at;         /* [n_signals + 1] the instruction that started each, measuring */
    double *op_ms;           /* [n_signals + 1] each collective's own time, measuring */
    unsigned char *resident; /* [n_units] kept gathered from forward to backward, or NULL */
    unsigned char *frozen_resident; /* [frozen_layout's n_units] the same, or NULL */
    int n_resident;                 /* of both */
    regc_graph *graph;
    int n_regions;
    regc_compiled_region **regions;
    int n_pieces;
    piece *pieces;
    int n_steps;
    lazy_step *steps;
    int n_instr;
    regc_instr *instr; /* the flat program (inline back) */
    int n_bufs, cap_bufs;
    regc_buf *bufs;
    int n_inputs;
    int *inputs; /* graph tensor ids */
    regc_ref loss;
    int64_t arena_bytes, lower_bound;
    int fused_pairs, reordered;
    int n_update;
    regc_instr *update;   /* the optimizer step */
    int64_t block_bytes;  /* of each parameter-shaped block (params, grads, m, v) */
    int64_t frozen_bytes; /* of the frozen block: the parameters never trained */
    /* bound memory */
    regc_backend *be;
    void *arena;
    regc_step_scalars *own_scalars; /* allocated by bind when none was given */
    int offload;                    /* the update runs on the host (offload_optimizer) */
    int offload_activation;         /* saved activations to the host and back (offload.c) */
    int offload_limit;              /* compiling: at most this many, the largest first; -1 all */
    int64_t host_budget_bytes;      /* compiling: the host bytes a rank may hold; 0: no limit */
    double copy_flop_per_byte; /* compiling: the compute that hides a byte's copy (offload.c) */
    regc_backend *host_be;     /* where the offloaded AdamW runs: be, or own_host_be */
    int64_t *no_decay;         /* [2 n_no_decay] ranges AdamW does not decay (bind's copy) */
    int n_no_decay;
    regc_backend *own_host_be; /* a CPU backend when be is a GPU's */
    regc_comm *comm;           /* borrowed, or own_comm */
    regc_comm *own_comm;       /* when bind was given none: one process */
    regc_shard_layout *layout; /* stage 3: the units and this rank's shards */
    /* stage 3: the frozen parameters' units and shards, in 4-byte words of
     * the frozen block (NULL: none frozen) */
    regc_shard_layout *frozen_layout;
    regc_comm_queue *queue; /* runs the asynchronous collectives (ranks > 1) */
    int64_t *tickets;       /* [n_signals + 1] each started collective's ticket */
    double wait_ms;         /* blocked in K_COMM_WAIT, over every run */
    char **ptr;             /* [n_bufs] base pointers */
    /* O0: the buffers offloaded (bufs' away >= 0) and, by buffer, their
     * host copies ([n_bufs]); made at the first run */
    int *offloaded, n_offloaded;
    void **host_copy;
    regc_profile *profile; /* borrowed; NULL: runs are not timed */
    void *captured[2];     /* O2: the run and the update as graphs, or NULL */
    int eager_runs[2];     /* of each phase before it was captured */
    int capture_failed[2]; /* the backend could not capture it: it runs as at O1 */
    double capture_ms;     /* capturing them, over every run */
    regc_bytes step_key;   /* the compile cache's key of the step, when cached */
};

/* ZeRO-3's gather units, the frozen parameters' with the trained ones'. */
static inline int regc_program_gather_units(const regc_program *p)
{
    return (p->layout ? p->layout->n_units : 0) +
           (p->frozen_layout ? p->frozen_layout->n_units : 0);
}

/* Building a step program (region/program.c): the flat graph (owned by
 * the program from here on), regions, then their instances in execution
 * order; link builds the lazy program and, when asked, inlines it back. */
regc_program *regc_program_new(regc_graph *g, regc_level level);
/* Takes r (freed on failure); returns its index or a negative status. */
int regc_program_add_region(regc_program *p, regc_compiled_region *r);
int regc_program_add_piece(regc_program *p, int region, const int *in, const int *out);
/* param_offset[t]: byte offset of graph parameter t in the blocks (a
 * frozen one's in the frozen block). With
 * p->layout (ZeRO-3) the
 * blocks are this rank's shards and the communication is placed
 * (zero3_place.c). */
int regc_program_link(regc_program *p, const int64_t *param_offset, int inline_flat,
                      regc_compile_stats *st);
/* Undo link: the program is its regions and pieces again, ready to be
 * linked anew (with another schedule). */
void regc_program_unlink(regc_program *p);
int regc_program_n_regions(const regc_program *p);
const regc_graph *regc_program_graph(const regc_program *p);
const regc_compiled_region *regc_program_region(const regc_program *p, int i);

#endif
