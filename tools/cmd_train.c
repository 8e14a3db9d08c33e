/* cmd_train.c — `regc train`: flags and the config file into training
 * options, one line per step out. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "regc_train.h"
#include "regc_zero3.h"

void print_train_usage(FILE *f)
{
    fputs("usage: regc train --model <hf-dir|graph.json|preset> [options]\n"
          "       regc train --config <FILE> [--deepspeed <ds_config.json>] [options]\n"
          "\n"
          "Train a model for a number of steps with AdamW, printing one line per step.\n"
          "\n",
          f);
    regc_option_write_usage(f);
    fputs("\n  -h, --help             print this text\n", f);
}

/* Set by SIGINT and SIGTERM; the trainer polls it after every step. */
static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

/* ---- per-step output */

typedef struct {
    int quiet; /* another rank prints */
    int json;
    int progress;    /* stdout is a terminal: one line replaced in place */
    int steps;       /* of the run, for step / total and the ETA */
    int first;       /* the first step this process runs (a resumed run starts later) */
    double start_ms; /* when that step began */
    int line_open;   /* a progress line is on the terminal, not yet ended */
    int show_lr;     /* a schedule moves the learning rate: report it */
    int step_width;  /* digits of the last step, so the columns line up */
    int write_failed;
    const char *cache_dir;
    int ranks;
} step_printer;

/* With a cache: what it gave, on stderr before the first step; under
 * ZeRO-3, the schedule. */
static void on_compiled(const regc_compile_stats *st, void *user)
{
    const step_printer *p = user;
    if (st->replan_step > 0 && !p->quiet)
        fprintf(stderr,
                "step %lld: the step compiled again with the profile measured so far "
                "(compile.schedule) in %.1f ms%s\n",
                (long long)st->replan_step,
                st->cache_hits ? st->cache_ms
                               : st->build_ms + st->detect_ms + st->compile_ms + st->inline_ms,
                st->measured_kernels > 0 ? ", what to recompute ranked by the kernels' measured "
                                           "time"
                                         : "");
    if (st->zero3_units && !p->quiet)
        print_zero3_schedule(stderr, st);
    if (p->cache_dir && !p->quiet)
        fprintf(stderr, "compile cache %s: %d hit%s, %d miss%s (%.1f ms)\n", p->cache_dir,
                st->cache_hits, st->cache_hits == 1 ? "" : "s", st->cache_misses,
                st->cache_misses == 1 ? "" : "es", st->cache_ms);
}

/* "1:05:09" or "5:09" */
static void clock_text(char *buf, size_t cap, double s)
{
    long t = s > 0 && s < 1e9 ? (long)(s + 0.5) : 0;
    if (t >= 3600)
        snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

/* The runtime's own account of its device memory, before the first step,
 * on stderr beside the other notes (--json step lines carry the measured
 * high-water mark as device_peak). */
static void on_memory(const regc_device_memory *a, void *user)
{
    const step_printer *p = user;
    if (!p->quiet)
        print_device_memory(stderr, a, p->ranks);
}

/* What the ranks read at start-up: a file's bytes once between them. */
static void on_loaded(const regc_load_report *r, void *user)
{
    const step_printer *p = user;
    if (p->quiet || !r->from || r->bytes == 0)
        return;
    char size[32];
    size_text(size, sizeof size, r->bytes);
    fprintf(stderr, "weights: %s (%lld bytes) read from %s in %.0f ms (%.2f GB/s", size,
            (long long)r->bytes, r->from, r->ms, r->ms > 0 ? (double)r->bytes / r->ms / 1e6 : 0.0);
    if (p->ranks > 1)
        fprintf(stderr, ", %d ranks each reading their shards", p->ranks);
    fprintf(stderr, ")\n");
}

/* The training data: the files a pattern named, their tokens. */
static void on_data(const regc_data_report *d, void *user)
{
    const step_printer *p = user;
    if (p->quiet || !d->from)
        return;
    fprintf(stderr, "data: %s: %d file%s, %lld tokens%s, checked in %.0f ms\n", d->from, d->files,
            d->files == 1 ? "" : "s", (long long)d->tokens, d->masked ? " and their mask" : "",
            d->ms);
}

/* The terminal's progress line, replaced in place each step; the last step
 * ends it with a newline. */
static int print_progress(step_printer *p, const regc_step_report *r)
{
    if (r->step == p->first || r->resumed) {
        p->first = r->step;
        p->start_ms = regc_time_ms() - r->ms;
    }
    double elapsed = (regc_time_ms() - p->start_ms) / 1e3;
    int done = r->step - p->first + 1, left = p->steps - r->step - 1;
    char el[32], eta[32], extra[64] = "";
    clock_text(el, sizeof el, elapsed);
    clock_text(eta, sizeof eta, elapsed / done * left);
    if (p->show_lr)
        snprintf(extra, sizeof extra, " | lr %.2e", r->lr);
    if (!isnan(r->grad_norm))
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), " | norm %.3f",
                 (double)r->grad_norm);
    if (r->nonfinite)
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), " | skipped");
    p->line_open = left > 0;
    return printf("\r\033[Kstep %d/%d | loss %.4f%s | %.0f tok/s | %s elapsed | ETA %s%s",
                  r->step + 1, p->steps, (double)r->loss, extra, r->tokens_per_s, el, eta,
                  left == 0 ? "\n" : "");
}

static void on_step(const regc_step_report *r, void *user)
{
    step_printer *p = user;
    if (p->quiet)
        return;
    int n;
    /* the learning rate with a schedule, the norm with clipping */
    char extra[192] = "";
    if (p->json) {
        char loss[48], ms[48], tps[48], v[48];
        /* %.9g round-trips any float, so a reader recovers the exact loss. */
        json_number(loss, sizeof loss, "%.9g", (double)r->loss);
        json_number(ms, sizeof ms, "%.6g", r->ms);
        json_number(tps, sizeof tps, "%.6g", r->tokens_per_s);
        if (p->show_lr) {
            json_number(v, sizeof v, "%.9g", r->lr);
            snprintf(extra, sizeof extra, ", \"lr\": %s", v);
        }
        if (!isnan(r->grad_norm)) {
            json_number(v, sizeof v, "%.9g", (double)r->grad_norm);
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", \"grad_norm\": %s", v);
        }
        if (r->nonfinite)
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", \"skipped\": \"%s\"",
                     r->nonfinite);
        if (r->device_peak > 0)
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", \"device_peak\": %lld",
                     (long long)r->device_peak);
        if (r->comm_ms > 0.0) {
            json_number(v, sizeof v, "%.6g", r->comm_ms);
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", \"comm_ms\": %s", v);
            json_number(v, sizeof v, "%.6g", r->comm_wait_ms);
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", \"comm_wait_ms\": %s",
                     v);
        }
        n = printf("{\"step\": %d, \"loss\": %s%s, \"ms\": %s, \"tokens_per_s\": %s}\n", r->step,
                   loss, extra, ms, tps);
    } else if (p->progress) {
        n = print_progress(p, r);
    } else {
        if (p->show_lr)
            snprintf(extra, sizeof extra, " | lr %.3e", r->lr);
        if (!isnan(r->grad_norm))
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra), " | norm %7.4f",
                     (double)r->grad_norm);
        if (r->nonfinite)
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra),
                     " | skipped: %s not finite", r->nonfinite);
        if (r->comm_ms > 0.0)
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra),
                     " | comm %.1f ms, %.0f%% hidden", r->comm_ms,
                     100.0 * (1.0 - r->comm_wait_ms / r->comm_ms));
        n = printf("step %*d | loss %7.4f%s | %8.1f ms | %8.0f tok/s\n", p->step_width, r->step,
                   (double)r->loss, extra, r->ms, r->tokens_per_s);
    }
    if (!isnan(r->val_loss) && n >= 0) {
        char v[48];
        json_number(v, sizeof v, "%.9g", (double)r->val_loss);
        n = p->json ? printf("{\"step\": %d, \"val_loss\": %s}\n", r->step, v)
                    : printf("%sstep %*d | val_loss %7.4f%s", p->progress ? "\n" : "",
                             p->step_width, r->step, (double)r->val_loss, p->progress ? "" : "\n");
    }
    if (r->checkpoint && n >= 0) {
        if (p->json) {
            char *q = json_quote(r->checkpoint);
            n = q ? printf("{\"step\": %d, \"checkpoint\": %s}\n", r->step, q) : -1;
            free(q);
        } else {
            if (p->line_open)
                putchar('\n'), fflush(stdout);
            p->line_open = 0;
            fprintf(stderr, "checkpoint %s\n", r->checkpoint);
        }
    }
    /* Flushed per step: the lines are progress, and a reader on a pipe
     * (a log collector, a test) should see each one as it happens. */
    if (n < 0 || fflush(stdout) != 0)
        p->write_failed = 1;
}

/* Load the model and train it; the strings in s may belong to cfg. */
/* An error of the library: its line (REGC_ERR_RANK: another rank reported
 * it), then, with several ranks, the end of every rank, so that none waits
 * for this one in a collective. */
static int report_error(regc_comm *comm, int rc)
{
    if (rc != REGC_ERR_RANK) {
        if (comm->size > 1)
            fprintf(stderr, "regc [rank %d]: %s\n", comm->rank, regc_error_message());
        else
            fprintf(stderr, "regc: %s\n", regc_error_message());
    }
    if (comm->size > 1) {
        fflush(stderr);
        comm->abort(comm, EXIT_ERROR);
    }
    return EXIT_ERROR;
}

static int train_run(const regc_train_settings *s, const regc_config *cfg, regc_comm *comm)
{
    regc_train_options o = s->train;
    const char *model_spec = s->model, *weights_path = s->weights;
    int json = s->json;
    if (!model_spec)
        return usage_error("--model is required (a Hugging Face directory or a preset; see "
                           "regc train --help), unless the --config file sets train.model");

    /* contradictions among the options before anything is loaded or printed */
    int rc = regc_train_check_options(&o);
    if (rc != REGC_OK)
        return report_error(comm, rc);
    /* Shapes only: the trainer reads the weights, each rank only its
     * shards under ZeRO-3, and writes --save from the device. */
    regc_model *model = NULL;
    if ((rc = regc_model_load_shapes(model_spec, &model)) != REGC_OK)
        return report_error(comm, rc);
    const char *arch = regc_model_arch(model); /* static, outlives the model */
    if (weights_path && strcmp(arch, "graph") != 0) {
        regc_model_free(model);
        /* From the file it is the file that is wrong, not the usage. */
        if (cfg && weights_path == regc_config_weights(cfg)) {
            fprintf(stderr,
                    "regc: %s: train.weights: applies to graph JSON models only (%s is a %s "
                    "model)\n",
                    s->config, model_spec, arch);
            return EXIT_ERROR;
        }
        return usage_error("--weights applies to graph JSON models only (%s is a %s model)",
                           model_spec, arch);
    }
    o.weights = weights_path                                                 ? weights_path
                : regc_model_is_preset(model_spec) || !strcmp(arch, "graph") ? NULL
                                                                             : model_spec;
    o.return_weights = 0;
    if ((rc = cli_apply_model_settings(s, model))) {
        regc_model_free(model);
        return report_error(comm, rc);
    }
    char desc[1024];
    regc_model_describe(model, desc, sizeof desc);
    if (comm->rank == 0)
        fprintf(stderr, "%s\n", desc);
    if (comm->rank == 0 && regc_model_has_lora(model)) {
        regc_lora_describe(model, desc, sizeof desc);
        fprintf(stderr, "%s\n", desc);
    }

    /* rank 0 speaks for every rank */
    step_printer p = {.quiet = comm->rank != 0,
                      .json = json,
                      .progress = !json && isatty(STDOUT_FILENO),
                      .steps = o.steps,
                      .step_width = 4,
                      .cache_dir = o.cache_dir,
                      .ranks = comm->size,
                      .show_lr = o.lr_scheduler != REGC_SCHEDULE_CONSTANT};
    o.on_compiled = on_compiled;
    o.on_memory = on_memory;
    o.on_loaded = on_loaded;
    o.on_data = on_data;
    for (int last = o.steps - 1, w = 1; last >= 10; last /= 10)
        if (++w > p.step_width)
            p.step_width = w;

    if (s->profile && !(o.profile = regc_profile_new())) {
        regc_model_free(model);
        return report_error(comm, REGC_ERR_MEMORY);
    }
    o.comm = comm;
    /* SIGINT and SIGTERM: finish the step, checkpoint, exit 0 */
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    o.stop = &stop_requested;
    int stopped_at = -1;
    rc = regc_train(model, &o, on_step, &p, &stopped_at);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    regc_model_free(model);
    if (rc == REGC_OK && o.profile && comm->rank == 0)
        rc = regc_profile_write(o.profile, stderr);
    regc_profile_free(o.profile);
    if (rc != REGC_OK)
        return report_error(comm, rc);
    if (p.write_failed || fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "regc: writing to standard output failed\n");
        return EXIT_ERROR;
    }
    if (stopped_at >= 0 && comm->rank == 0) {
        fprintf(stderr, "stopped by a signal after step %d%s%s\n", stopped_at - 1,
                o.output_dir ? "; resume with --resume-from-checkpoint latest --output-dir " : "",
                o.output_dir ? o.output_dir : " (no --output-dir: nothing saved)");
        return 0;
    }
    if (stopped_at < 0 && o.save_dir && !json && comm->rank == 0)
        fprintf(stderr, "saved %s\n", o.save_dir);
    return 0;
}

/* The settings made whole (epochs need the model's rows: T5 reads two
 * rows' worth of tokens a row), then printed and the command done. */
static int resolve(regc_train_settings *s, regc_origins *from, regc_comm *comm)
{
    regc_model *m = NULL;
    int rc = REGC_OK;
    if (s->train.num_train_epochs > 0.0 && s->model)
        rc = regc_model_load_shapes(s->model, &m);
    if (rc == REGC_OK)
        rc = regc_settings_resolve(s, from, comm->size, m);
    regc_model_free(m);
    return rc;
}

/* Flags and the config files into settings, then the run. */
static int train_command(int argc, char **argv, regc_comm *comm)
{
    /* The compile cache is on by default, in the user's cache directory
     * (none when neither XDG_CACHE_HOME nor HOME is set). */
    char default_cache[4096];
    const char *cache = regc_cache_default_dir(default_cache, sizeof default_cache) == REGC_OK
                            ? default_cache
                            : NULL;
    cli_settings c;
    regc_train_settings_default(&c.s);
    c.s.train.cache_dir = cache;
    int help = 0, usage = 0;
    int rc = cli_read_settings(argc, argv, &c, &help, &usage);
    if (usage || help) {
        if (help)
            print_train_usage(stdout);
        cli_settings_free(&c);
        return usage;
    }
    regc_train_settings s = c.s;
    regc_origins *from = c.from;
    if (rc == REGC_OK) {
        if (s.no_cache) {
            s.train.cache_dir = NULL;
            regc_origins_flag(from, regc_option_by_flag("--cache-dir"), "--no-cache");
        }
        rc = resolve(&s, from, comm);
    }
    /* --print-config: rank 0 prints what every rank resolved alike */
    if (rc == REGC_OK && s.print_config && comm->rank == 0)
        rc = regc_settings_print(stdout, &s, from);
    int exit_code = rc != REGC_OK    ? report_error(comm, rc)
                    : s.print_config ? 0
                                     : train_run(&s, c.cfg, comm);
    cli_settings_free(&c);
    return exit_code;
}

int cmd_train(int argc, char **argv)
{
    usage_cmd = "regc train";
    /* Under mpirun every rank runs this; rank 0 speaks for all of them. */
    regc_comm *comm = NULL;
    if (regc_comm_open(&comm) != REGC_OK) {
        fprintf(stderr, "regc: %s\n", regc_error_message());
        return EXIT_ERROR;
    }
    usage_quiet = comm->rank != 0;
    int rc = train_command(argc, argv, comm);
    regc_comm_free(comm);
    return rc;
}
