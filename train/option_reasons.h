/* option_reasons.h — private to train/options.c: why a key of DeepSpeed's
 * or Transformers' changes nothing in regc, or is refused at all but its
 * neutral values, as the help of the table's rows says it. */
#ifndef REGC_OPTION_REASONS_H
#define REGC_OPTION_REASONS_H

#define WHY_REPORT "logging, reporting and the Hub: regc reports every step on stdout"
#define WHY_EVAL                                                                                   \
    "evaluation, which changes no training step: regc validates on val_data after every "          \
    "eval_steps steps"
#define WHY_LOADER                                                                                 \
    "data loading: regc reads the token file's rows itself, in llm.c's order or as train.shuffle " \
    "draws them"
#define WHY_DEVICE "the device and launcher: regc's are compile.backend and mpirun"
#define WHY_SAVE "what a save holds: --save and checkpoints write what a resume needs, in fp32"
#define WHY_COMPILE "torch.compile: regc compiles every step"
#define WHY_DIST "the launcher's bookkeeping: regc's ranks sum the gradients as one process would"
#define WHY_ZERO_COMM                                                                              \
    "how ZeRO communicates, which changes no value: the compiler places regc's collectives and "   \
    "compile.passes schedules them"
#define WHY_STAGE12 "ZeRO stage 1 and 2 only: regc builds stages 0 and 3"
#define WHY_NVME "NVMe offload only, whose device (\"nvme\") is refused"
#define WHY_OFFLOAD_PARAM                                                                          \
    "parameter offload, which regc does not do: each rank keeps its parameter shard on its "       \
    "device"
#define WHY_FP16                                                                                   \
    "fp16 mixed precision: regc has no loss scaling (bf16.enabled is its mixed precision)"
#define WHY_FP16_OFF "fp16's settings, which apply only with fp16.enabled true, refused"
#define WHY_MONITOR "a monitor or profiler: regc's are --json and --profile"
#define WHY_CKPT_DS                                                                                \
    "DeepSpeed's checkpoints: regc's are Hugging Face directories that resume at any rank count "  \
    "keeping the global batch"
#define WHY_ACT_CKPT                                                                               \
    "deepspeed.checkpointing, which a model's own code calls: regc recomputes as "                 \
    "compile.recompute says"
#define WHY_DC_SYNC "DeepCompile's synchronisation around its collectives: timing only"
#define WHY_QUANT_COMM                                                                             \
    "quantised ZeRO++ communication, which changes values: regc sends fp32 (or bf16 gathers "      \
    "under compile.precision bf16)"
#define WHY_PREDIVIDE                                                                              \
    "when the gradients are divided by the ranks: regc's are already the global batch's mean "     \
    "when summed (each micro-batch's loss seeded with its share)"
#define WHY_OPT_CHECK                                                                              \
    "DeepSpeed's check of an optimizer under ZeRO: regc's AdamW runs at every stage"
#define WHY_SAVE_GATHER "regc's --save and checkpoints gather every shard always, in fp32"
#define WHY_OFFLOAD_PARAM_OFF                                                                      \
    "parameter offload's settings, which apply only with offload_param.device cpu or nvme, "       \
    "refused"

#endif
