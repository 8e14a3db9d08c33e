/* cli.h — what the `regc` commands share: exit codes, usage errors and
 * strict parsing of flag values, and each command's entry point
 * (tools/cmd_*.c). */
#ifndef REGC_CLI_H
#define REGC_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "regc_train.h"

enum { EXIT_ERROR = 1, EXIT_USAGE = 2 };

/* The command usage errors are reported for ("regc train", ...). */
extern const char *usage_cmd;
/* Set on the ranks other than 0: they make the same mistakes silently. */
extern int usage_quiet;

/* One line on stderr, prefixed with the command; returns EXIT_USAGE. */
int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Strict values: the whole text must be the number, in range; on failure
 * a usage error is printed and EXIT_USAGE returned (the exit status). */
int parse_int(const char *flag, const char *text, long long min, long long max, const char *what,
              long long *out);
/* The flag name of argv[i] into flag and its value ("--flag=value" or
 * "--flag value"), or NULL when it has none. */
const char *split_flag(int argc, char **argv, int i, char *flag, size_t cap);
/* A command's exit code once the library returned rc: 1 with its message
 * on a failure, or when writing standard output failed; else 0. */
int exit_code(int rc);
/* s as a JSON string literal, quotes included; malloc'd (NULL when out of
 * memory). */
char *json_quote(const char *s);
/* "null" for what JSON cannot hold (NaN, infinities), else fmt of v. */
void json_number(char *buf, size_t cap, const char *fmt, double v);

/* "12.3 MiB", "1.50 GiB", "512 bytes" */
void size_text(char *buf, size_t cap, int64_t bytes);
/* A run's device memory per rank (regc_program_device_memory), one line. */
void print_device_memory(FILE *f, const regc_device_memory *a, int ranks);
/* ZeRO-3's schedule as compiled (units, prefetch, resident units), one line. */
void print_zero3_schedule(FILE *f, const regc_compile_stats *st);

/* regc train's options as a command reads them (cli_settings.c): the
 * settings, where each came from, and the config files its strings may
 * point into. */
typedef struct {
    regc_train_settings s;
    regc_origins *from;
    regc_config *cfg, *ds; /* --config's and the DeepSpeed config, or NULL */
} cli_settings;
/* argv through the option table into c->s, whose values on entry are the
 * defaults: the config files first, then every flag over them. *usage:
 * the usage exit code (the message printed) or 0; *help: -h or --help was
 * given (nothing else read). Returns REGC_OK or the library's error, the
 * message set. cli_settings_free releases the files and origins. */
int cli_read_settings(int argc, char **argv, cli_settings *c, int *help, int *usage);
void cli_settings_free(cli_settings *c);
/* The settings' lora section (or --adapter's adapter_config.json) onto the
 * model: LoRA is on when lora.r or --adapter is given; a lora key without
 * it, or beside an adapter that has its own, would not be applied and is
 * refused. */
int cli_apply_lora(const regc_train_settings *s, regc_model *model);
/* The model as the run trains it: its dropouts, its packed documents
 * (eod_token_id and the switches beside it), then LoRA. */
int cli_apply_model_settings(const regc_train_settings *s, regc_model *model);

/* The commands: argv after the command's name; each returns the exit code. */
int cmd_train(int argc, char **argv);
int cmd_dump_graph(int argc, char **argv);
int cmd_detect(int argc, char **argv);
int cmd_coldstart(int argc, char **argv);
int cmd_cache(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_merge(int argc, char **argv);
void print_train_usage(FILE *f);
void print_dump_graph_usage(FILE *f);
void print_detect_usage(FILE *f);
void print_coldstart_usage(FILE *f);
void print_cache_usage(FILE *f);
void print_plan_usage(FILE *f);
void print_merge_usage(FILE *f);

#endif
