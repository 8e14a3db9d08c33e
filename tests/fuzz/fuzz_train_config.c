/* fuzz_train_config.c — the training config file (train/config.c over the
 * option table of train/options.c) on arbitrary bytes; an accepted file is
 * applied over the defaults and queried. */
#include <stdint.h>
#include <stdlib.h>

#include "fuzz_util.h"
#include "regc_train.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_text(data, size);
    regc_config *c = NULL;
    int rc = regc_config_parse(text, size, "cfg.json", &c);
    if (rc != REGC_OK) {
        fuzz_check_failure(rc);
        if (c)
            abort();
    } else {
        regc_train_settings s;
        regc_train_settings_default(&s);
        regc_config_apply(c, &s);
        (void)regc_config_model(c);
        (void)regc_config_weights(c);
        (void)regc_config_json(c);
        regc_config_free(c);
    }
    free(text);
    return 0;
}
