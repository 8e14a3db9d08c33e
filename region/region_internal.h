/* region_internal.h — what the files of the region compiler share. */
#ifndef REGC_REGION_INTERNAL_H
#define REGC_REGION_INTERNAL_H

#include "program.h"

/* Lower the region graph's nodes to the forward and backward instruction
 * lists (region/lower.c): at O1 and O2 views become aliases, matmuls take
 * their bias and GELU as GEMM epilogues, a norm's backward takes the
 * gradient sum after it, and elementwise chains fuse. slot_of[t] is the
 * slot of region tensor t. */
int regc_region_lower(regc_compiled_region *r, const int *slot_of, regc_level level);
/* compile.precision on a lowered region (region_bf16.c): bf16 GEMMs, and
 * with bf16_storage the tensors only they read held in bf16. */
int regc_region_apply_precision(regc_compiled_region *r, regc_precision precision, int bf16_storage,
                                const char *in_held);

/* A new temporary of r, `bytes` long, of slot like's tensor and storage
 * (region.c): its index, or a negative status. */
int regc_region_add_temp(regc_compiled_region *r, int like, int64_t bytes);

/* compile.recompute on a lowered region (recompute.c): saved slots
 * dropped after the forward and replayed in the backward, as the policy
 * (program.h) says. */
/* A saved slot that can be recomputed: the bytes it frees per instance,
 * the cost of its replay (FLOPs, or measured: pol's costs), and whether
 * that replay is heavy (runs a GEMM or attention, or costs many FLOPs per
 * byte: not selective's). */
typedef struct {
    int slot;
    int64_t bytes;
    double cost;
    int heavy;
    int glue; /* made by a whole-graph region's glue (REGC_KEEP_GLUE) */
} regc_recompute_candidate;
int regc_region_recompute(regc_compiled_region *r, const regc_recompute_policy *pol,
                          const char *keep);
/* What an instruction costs, in FLOPs (elementwise kernels: one per
 * element touched). */
double regc_instr_cost(const regc_instr *in);
/* The row of rows[*n] (room for one more) that counts `in`: its label's,
 * a recomputation as its kernel, added (zeroed) when there is none yet. */
int regc_kernel_cost_row(regc_kernel_cost *rows, int *n, const regc_instr *in);
/* Measured kernel costs' average rate, cost per millisecond (0: none). */
double regc_kernel_cost_rate(const regc_kernel_cost *k, int n);

/* compile.logits_chunk_rows on a lowered region (chunk.c): the head's
 * GEMM and its cross-entropy in chunks of rows, forward and backward; a
 * region without that pattern is left as it is. held: the precision pass
 * will hold saved activations in bf16 (then elementwise steps between the
 * head and the loss stay whole: chunked, they would not be held, and the
 * bits would change). */
int regc_region_chunk_logits(regc_compiled_region *r, int64_t chunk_rows, int held);

/* compile.offload_activation on the flat program (offload.c): saved
 * activations copied to host memory after their forward's last use and
 * back before their backward's first, on the copy queue. */
int regc_offload_activations(regc_program *p);
/* The same at O0, whose lazy program allocates as it runs: each buffer of
 * MIN_BYTES and more that a forward step uses and a backward step uses
 * again, no unit's gathered parameters, with a buffer of that size first
 * used between the two (room its leaving serves), chosen as the flat pass
 * chooses (largest first, the host's room, offload_limit), gets the steps
 * it leaves after and comes back before (bufs' away, back; program_run.c
 * copies it then). */
int regc_offload_lazy(regc_program *p);

/* Fusions over a flat instruction list (region/fuse_instr.c). The residual
 * add fused with the norm that reads its sum right after it, in place;
 * returns the number of pairs fused. */
int regc_fuse_add_norm(regc_instr *ins, int *n);

/* An embedding backward whose fresh table only feeds an add into the
 * gradient it sums with (out = out + table) accumulates into out at the
 * add's place instead, and the add goes; bufs are the program buffers the
 * instructions name. Returns the number fused. */
int regc_fuse_embed_bwd_add(regc_instr *ins, int *n, const regc_buf *bufs);

/* ---- the step program's parts */
/* A new program buffer (program.c); its index or a negative status. */
int regc_program_new_buf(regc_program *p, regc_buf_kind kind, int64_t bytes, int64_t offset);
/* Stamp the lazy program into one flat list, run the cross-layer passes
 * and plan the step's activation memory (inline_back.c). */
int regc_program_inline_back(regc_program *p);
/* Plan a program that stays lazy over lifetimes in whole calls (nothing
 * to plan at O0, which allocates at run time). */
int regc_program_plan_lazy(regc_program *p);
/* fn(p, buf, step, user) for each buffer reference of each lazy step, in
 * step order (a buffer once per reference). */
void regc_lazy_each_ref(regc_program *p, void (*fn)(regc_program *p, int buf, int step, void *user),
                        void *user);

/* ZeRO-3's gather units and shard layout (p->layout) from the program's
 * pieces; param_offset[t]: graph parameter t's byte offset in the model's
 * block. */
int regc_zero3_layout(regc_program *p, const int64_t *param_offset, const char *held_param);
/* ZeRO-3 (zero3_place.c): all-gathers before the steps that read a unit's
 * parameters, zeroed unit gradient buffers, reduce-scatters after the last
 * step that writes them, over the lazy program (p->layout says where each
 * parameter lies). */
int regc_zero3_place(regc_program *p);

/* ZeRO-3's schedule (zero3_schedule.c): the flat program's collectives
 * made asynchronous, all-gathers started ahead within prefetch_floats (-1:
 * one unit ahead; 0: on demand), reduce-scatters overlapping the next
 * unit's backward. */
int regc_zero3_schedule(regc_program *p, int64_t prefetch_floats, int64_t max_live_floats,
                        int64_t reduce_bucket_floats, int overlap);
/* The gradient block's transfers moved into the backward (grad_schedule.c):
 * stage 0's bucket all-reduces, each started after the last instruction
 * that writes its gradients and all waited for at the program's end; an
 * offloaded update's copy to the host, one range at a time, likewise. */
int regc_allreduce_schedule(regc_program *p);
int regc_offload_schedule(regc_program *p);

/* The schedule passes (passes.c): run the ones o->passes names on p's
 * schedule, then link p with it. */
int regc_passes_run(regc_program *p, const int64_t *param_offset, int inline_flat,
                    const regc_compile_options *o, regc_compile_stats *st);
/* prefetch, overlap_reduce, selective_gather */
void regc_pass_list_default(regc_pass_list *l);
/* The built-in selective_gather pass (zero3_budget.c). */
int regc_pass_selective_gather(const regc_pass_input *in, regc_comm_schedule *s, void *user);

/* ---- the driver (region/compile.c) and the budget's search (compile_fit.c) */
/* Compile graph g (taken: the program owns it from here on, and it is
 * freed on failure), its parameter tensor t at byte param_offset[t] of the
 * parameter and gradient blocks. */
int regc_compile_graph_taken(regc_graph *g, const int64_t *param_offset,
                             const regc_compile_options *o, regc_program **out,
                             regc_compile_stats *st);
/* Compile g (taken) with the least recomputation, offloading and chunking
 * that fits o->budget_bytes (recompute auto), or refuse naming the least
 * memory any choice reached. */
int regc_compile_fitting(regc_graph *g, const int64_t *param_offset, const regc_compile_options *o,
                         regc_program **out, regc_compile_stats *st);

/* ---- the compile cache's glue (region/compile_cache.c) */
/* Is the cache read and written? (Dumps always compile afresh.) */
int regc_compile_uses_cache(const regc_compile_options *o);
/* One region: loaded when the cache holds its canonical form, else
 * compiled (counted in *compiles) and stored. */
int regc_compile_cached_region(const regc_graph *g, const regc_region_spec *spec, regc_level level,
                               const regc_compile_options *o, regc_compile_stats *st, int *compiles,
                               regc_compiled_region **out);
/* The start of a step's key: the target and the options that change the
 * program; the caller appends what the graph is built from. */
void regc_compile_step_key(const regc_compile_options *o, regc_bytes *b);
/* 1 and *out (with the stats it was compiled with) on a hit; 0 on a miss,
 * also when the entry does not decode. */
int regc_compile_load_step(const regc_compile_options *o, const regc_bytes *canon,
                           regc_program **out, regc_compile_stats *st);
/* Store p under canon; `what` describes the step in the entry's label. */
/* The backend's tuning for a program taken from or stored in the cache
 * (p->step_key), kept under the backend's device: load gives the backend
 * what an earlier start chose (bytes it refuses are a miss, said on
 * stderr like a refused step); store keeps what it holds now. Both do
 * nothing for a backend without tuning or a program without a key. */
void regc_compile_tuning_load(regc_cache *c, const regc_program *p, regc_backend *be);
int regc_compile_tuning_store(regc_cache *c, const regc_program *p, regc_backend *be);
int regc_compile_store_step(const regc_compile_options *o, const regc_bytes *canon,
                            const char *what, const regc_program *p, regc_compile_stats *st);

#endif
