/* libFuzzer harness: the plan parser (src/plan.c, mal_plan_parse_buffer)
 * and the layout rules (mal_plan_validate) on arbitrary bytes, against the
 * model and batch the plan itself implies; for a plan that passes, where
 * every rank sits and the JSON round trip, and for one of the `tiny`
 * model's 4 layers what `malleus-replan --simulate PLAN` runs on it: the
 * 1F1B simulator and the cost model. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "replan/replan.h"
#include "replan/sim.h"
#include "src/plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mal_plan plan, back;
    mal_plan_init(&plan);
    mal_plan_init(&back);
    if (mal_plan_parse_buffer(&plan, (const char *)data, size, "fuzz")) goto out;
    /* The model the plan describes: its layers, heads and FFN any power
     * of two up to 2^20 divides, the batch its micro-batches add up to. */
    int n_layers = 1;
    int64_t gb = 0;
    for (int p = 0; p < plan.n_pipelines; p++) {
        const mal_plan_pipeline *pl = &plan.pipelines[p];
        /* each product is below 2^62 in size; stop adding once far out of
         * range, so that the harness itself never overflows */
        if (gb > -((int64_t)1 << 40) && gb < ((int64_t)1 << 40))
            gb += (int64_t)pl->micro_batches * plan.micro_batch_size;
        for (int s = 0; s < pl->n_stages; s++)
            if (pl->stages[s].layer_end > n_layers) n_layers = pl->stages[s].layer_end;
    }
    int world = mal_plan_world_size(&plan);
    /* (a world of millions of ranks is the planner's to bound; keep runs fast) */
    if (world < 1 || world > 4096) goto out;
    /* Against the batch its micro-batches add up to when that fits an int;
     * otherwise against 16, which it must refuse. */
    int gbi = gb >= 1 && gb <= INT32_MAX ? (int)gb : 16;
    if (mal_plan_validate(&plan, world, n_layers, 1 << 20, 1 << 20, gbi)) goto out;
    if (gb != gbi) abort(); /* accepted a batch its micro-batches do not make */
    for (int r = 0; r < world; r++) {
        mal_plan_loc loc;
        if (mal_plan_locate(&plan, r, &loc)) abort(); /* a valid plan names every rank */
    }
    char *text;
    if (mal_plan_to_string(&plan, &text)) abort();
    if (mal_plan_parse_string(&back, text, "round trip") ||
        mal_plan_validate(&back, world, n_layers, 1 << 20, 1 << 20, gbi))
        abort();
    char *again;
    if (mal_plan_to_string(&back, &again) || strcmp(text, again)) abort();
    free(text);
    free(again);
    if (n_layers == 4) {
        static mal_profile prof;
        static int have_prof;
        if (!have_prof && mal_profile_preset(&prof, "tiny", 1)) abort();
        have_prof = 1;
        mal_cluster cl;
        double *rates = malloc(sizeof *rates * (size_t)world);
        double *pipe = malloc(sizeof *pipe * (size_t)plan.n_pipelines);
        if (!rates || !pipe || mal_cluster_regular(&cl, world, 1, 81920)) abort();
        for (int r = 0; r < world; r++)
            rates[r] = 1.0 + (r % 3);
        double step;
        mal_cost_eval ev = {0};
        if (!mal_sim_plan(&plan, &prof, rates, world, 0.0, &step, pipe) && !(step >= 0)) abort();
        (void)mal_cost_eval_plan(&plan, &prof, &cl, rates, &ev);
        mal_cost_eval_fini(&ev);
        mal_cluster_fini(&cl);
        free(rates);
        free(pipe);
    }
out:
    mal_plan_fini(&plan);
    mal_plan_fini(&back);
    return 0;
}
