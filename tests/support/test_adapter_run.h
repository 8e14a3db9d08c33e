/* test_adapter_run.h — the CLI runs the LoRA tests share: a short `regc
 * train` of the llama-tiny preset, the check that a run resumed from a
 * checkpoint is one that never stopped, and losses against a reference's. Failures fail the CMocka
 * test. */
#ifndef REGC_TEST_ADAPTER_RUN_H
#define REGC_TEST_ADAPTER_RUN_H

/* `regc train --model llama-tiny --batch 2 --seq 16 --threads 2 <args>`: its
 * exit status, its output in *out (stdout alone with --json, else stdout
 * and stderr). */
int regc_test_tiny_train(const char *args, char **out);

/* Trained 6 steps with `lora_args` (LoRA flags, no --steps), then 3 with a
 * checkpoint and 3 resumed from it: the same losses after it and the same
 * adapter file, byte for byte. `tag` names the temporary directory. */
void regc_test_assert_adapter_resume(const char *tag, const char *lora_args);

/* got[0 .. n-1] against the JSON array `want` (what `ref` computed), each
 * within rtol relative: printed step by step, the test failed if any is
 * not. */
struct cJSON;
void regc_test_check_losses(const char *name, const double *got, const struct cJSON *want, int n,
                            double rtol, const char *ref);

#endif
