/* cli_settings.c — regc train's options as every command that compiles a
 * step reads them (regc train, regc plan): the flags through the option
 * table (train/options.c), the config files under them, and the model's
 * LoRA from the settings. One reading, so a flag or a config key means the
 * same to the plan as to the run.
 *
 * The flags are parsed twice: once to find --config and --deepspeed and
 * to catch usage errors before anything is loaded, then over the settings
 * the files gave, so that every flag given overrides the files whatever
 * its position. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "regc_models.h"
#include "regc_train.h"

/* argv into s, each flag through the option table: 0, or the usage exit
 * code (the message printed). `from` (may be NULL) records the options
 * the flags set. */
static int parse_flags(int argc, char **argv, regc_train_settings *s, int *help, regc_origins *from)
{
    const char *valued = NULL; /* the flag whose value, a file, the argument before was */
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            *help = 1;
            return 0;
        }
        /* a file after a flag's value: a shell expanded the pattern meant
         * for regc into several arguments */
        if (strncmp(arg, "--", 2) != 0 && valued && access(arg, F_OK) == 0)
            return usage_error("unexpected argument \"%s\" after %s's value: several files "
                               "are one quoted pattern, %s 'dir/shard_*.bin'",
                               arg, valued, valued);
        if (strncmp(arg, "--", 2) != 0)
            return usage_error("unexpected argument \"%s\" (options start with --; see %s "
                               "--help)",
                               arg, usage_cmd);
        /* "--flag value" or "--flag=value"; a flag without a value only
         * ever has one after "=" */
        char flag[64];
        const char *value = split_flag(argc, argv, i, flag, sizeof flag), *eq = strchr(arg, '=');
        const regc_option *o = regc_option_by_flag(flag);
        if (!o)
            return !strcmp(flag, "--help")
                       ? usage_error("%s takes no value", flag)
                       : usage_error("unknown option %s (see %s --help)", flag, usage_cmd);
        if (!regc_option_takes_value(o))
            value = eq ? eq + 1 : NULL;
        else if (value && !eq) /* the value was the next argument */
            i++;
        valued = value && !eq && regc_option_takes_value(o) && access(value, F_OK) == 0
                     ? argv[i - 1]
                     : NULL;
        if (regc_option_set_text(o, s, value) != REGC_OK)
            return usage_error("%s", regc_error_message());
        regc_origins_flag(from, o, NULL);
    }
    return 0;
}

/* A config file applied over s: --config's, then the DeepSpeed one. */
static int load_config(const char *path, regc_config **cfg, regc_train_settings *s,
                       regc_origins *from)
{
    int rc = regc_config_load(path, cfg);
    return rc ? rc : regc_config_apply_from(*cfg, s, from);
}

int cli_read_settings(int argc, char **argv, cli_settings *c, int *help, int *usage)
{
    const regc_train_settings defaults = c->s;
    c->from = NULL, c->cfg = c->ds = NULL;
    *help = 0;
    if ((*usage = parse_flags(argc, argv, &c->s, help, NULL)) || *help)
        return REGC_OK;
    /* The files first (--config, then the DeepSpeed config that --deepspeed
     * or the first file names), then the command line over them. */
    const char *config = c->s.config, *ds_flag = c->s.deepspeed;
    c->s = defaults;
    c->from = regc_origins_new();
    int rc = c->from ? REGC_OK : regc_error(REGC_ERR_MEMORY, "out of memory");
    if (rc == REGC_OK && config)
        rc = load_config(config, &c->cfg, &c->s, c->from);
    const char *ds_path = ds_flag ? ds_flag : c->s.deepspeed;
    if (rc == REGC_OK && ds_path &&
        (rc = load_config(ds_path, &c->ds, &c->s, c->from)) == REGC_OK &&
        regc_config_deepspeed(c->ds))
        rc = regc_error(REGC_ERR_FORMAT, "%s: deepspeed: a DeepSpeed config names no other",
                        ds_path);
    if (rc == REGC_OK)
        parse_flags(argc, argv, &c->s, help, c->from); /* already checked: cannot fail */
    return rc;
}

void cli_settings_free(cli_settings *c)
{
    regc_config_free(c->ds);
    regc_config_free(c->cfg);
    regc_origins_free(c->from);
    c->ds = c->cfg = NULL, c->from = NULL;
}

int cli_apply_model_settings(const regc_train_settings *s, regc_model *model)
{
    const regc_documents docs = {.eod_token_id = s->eod_token_id,
                                 .reset_position_ids = s->reset_position_ids,
                                 .eod_mask_loss = s->eod_mask_loss};
    regc_model_set_dropout(model, s->dropout);
    int rc = regc_model_set_documents(model, &docs);
    return rc ? rc : cli_apply_lora(s, model);
}

/* The lora section (or --adapter's adapter_config.json) onto the model:
 * LoRA is on when lora.r or --adapter is given; a lora key without it, or
 * beside an adapter that has its own, would not be applied and is refused. */
int cli_apply_lora(const regc_train_settings *s, regc_model *model)
{
    const char *given = s->lora.alpha > 0.0           ? "lora_alpha"
                        : s->lora.dropout > 0.0       ? "lora_dropout"
                        : s->lora.use_rslora          ? "use_rslora"
                        : s->lora.targets.text[0]     ? "target_modules"
                        : s->adapter && s->lora.r > 0 ? "r"
                                                      : NULL;
    /* a checkpoint saved in 4 bits is NF4 as if load_in_4bit were given
     * (Transformers loads it so); regc_model_add_lora applies it */
    const int saved_nf4 = regc_model_checkpoint_nf4(model) != 0;
    const int base = s->lora.base_dtype, nf4 = s->quant.load_in_4bit || saved_nf4;
    int rc = regc_model_check_nf4_trainable(model, s->adapter || s->lora.r >= 1);
    if (rc)
        return rc;
    if (!s->quant.double_quant)
        return regc_error(REGC_ERR_ARG,
                          "quantization.bnb_4bit_use_double_quant: false is not supported (regc "
                          "holds NF4 with its absmaxes quantised again, as QLoRA does)");
    if (s->quant.compute_dtype && !nf4)
        return regc_error(REGC_ERR_ARG, "quantization.bnb_4bit_compute_dtype: the base is not in "
                                        "NF4 (quantization.load_in_4bit)");
    if ((base || nf4) && !s->adapter && s->lora.r < 1)
        return regc_error(REGC_ERR_ARG,
                          "%s: a frozen base in %s needs LoRA adapters to train (set lora.r, "
                          "--lora-r, or --adapter)",
                          nf4 ? "quantization.load_in_4bit" : "lora.base_dtype",
                          nf4 ? "NF4" : "bf16");
    if (given && (s->adapter || s->lora.r < 1))
        return regc_error(REGC_ERR_ARG, "lora.%s: %s", given,
                          s->adapter ? "the adapter's adapter_config.json says it (--adapter)"
                                     : "LoRA is off (set lora.r, --lora-r, to train adapters)");
    if (!s->adapter && s->lora.r < 1)
        return REGC_OK;
    char targets[1024];
    regc_lora_config c = {.r = s->lora.r,
                          .alpha = s->lora.alpha,
                          .dropout = s->lora.dropout,
                          .use_rslora = s->lora.use_rslora,
                          .target_modules = s->lora.targets.text[0] ? s->lora.targets.text : NULL,
                          .target_regex = s->lora.targets.regex};
    rc = s->adapter ? regc_lora_read_config(s->adapter, &c, targets, sizeof targets) : REGC_OK;
    c.seed = s->train.seed;
    c.base_dtype = base;
    c.load_in_4bit = nf4;
    c.compute_bf16 = s->quant.compute_dtype == 2;
    c.compute_given = s->quant.compute_dtype != 0;
    return rc ? rc : regc_model_add_lora(model, &c);
}
