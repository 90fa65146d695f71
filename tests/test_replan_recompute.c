/* Activation recomputation in the planner: the memory and time of each mode
 * against hand-computed figures, the cost model and the simulator on a plan
 * that recomputes, a cluster whose memory forces recomputation on exactly
 * the stages that need it (and nowhere when memory is ample), the
 * --recompute choices, and the refusal of a cluster that nothing fits even
 * with full recomputation (naming the stage, its need and the limit); the
 * bf16 state re-counted on a preset and the search with the master sharded. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "mal_test.h"
#include "replan/replan.h"
#include "replan/sim.h"
#include "replan_test.h"
#include "src/config.h"
#include "src/model.h"
#include "src/plan.h"

/* k[d] = 2 + d MB at the nominal TP 2: state 1 MB and activations 1 MB per
 * micro-batch in flight; selective keeps half of them for 5 % more time,
 * full an eighth for 25 % more. */
static void profile(mal_profile *p, int recompute)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "rc");
    p->n_layers = 8;
    p->tp = 2;
    p->alpha[0] = 1.9;
    p->alpha[1] = 1.0;
    p->n_k = 2;
    p->k = malloc(2 * sizeof *p->k);
    CHECK(p->k != NULL);
    p->k[0] = 2.0;
    p->k[1] = 3.0;
    p->embed_mb = 0.5;
    p->overhead_mb = 1.0;
    p->layer_time = 0.01;
    p->acts_kept[MAL_RECOMPUTE_NONE] = 1.0;
    p->acts_kept[MAL_RECOMPUTE_SELECTIVE] = 0.5;
    p->acts_kept[MAL_RECOMPUTE_FULL] = 0.125;
    p->recompute_time[MAL_RECOMPUTE_SELECTIVE] = 0.05;
    p->recompute_time[MAL_RECOMPUTE_FULL] = 0.25;
    p->recompute = recompute;
}

static void check_hand_figures(void)
{
    mal_profile p;
    profile(&p, MAL_REPLAN_RECOMPUTE_AUTO);
    /* stage 0 of 4 (3 warm-up forwards: 4 micro-batches in flight), 2
     * layers, TP 2: none 2 x (1 + 1 x 4) + E 0.5 + X 1 */
    CHECK_CLOSE(mal_cost_stage_need(&p, 2, 4, 0, 2, 3, 1, MAL_RECOMPUTE_NONE), 11.5, 1e-12, 0);
    /* selective: half of 2 x 4 MB not kept, a workspace of 0.5 MB */
    mal_cost_memory t;
    mal_cost_stage_terms(&p, 2, 4, 0, 2, 3, 1, MAL_RECOMPUTE_SELECTIVE, &t);
    CHECK_CLOSE(t.recompute_saved, 4.0, 1e-12, 0);
    CHECK_CLOSE(t.workspace, 0.5, 1e-12, 0);
    CHECK_CLOSE(t.total, 6.0 + 0.5 + 0.5 + 1.0, 1e-12, 0);
    /* full: 7/8 of 8 MB not kept, a workspace of 0.875 */
    mal_cost_stage_terms(&p, 2, 4, 0, 2, 3, 1, MAL_RECOMPUTE_FULL, &t);
    CHECK_CLOSE(t.recompute_saved, 7.0, 1e-12, 0);
    CHECK_CLOSE(t.total, 3.0 + 0.875 + 0.5 + 1.0, 1e-12, 0);
    /* TP 1 holds twice the nominal rank's share: activations 2 MB */
    CHECK_CLOSE(mal_cost_layer_acts(&p, 1), 2.0, 1e-12, 0);
    CHECK_CLOSE(mal_cost_stage_need(&p, 1, 4, 0, 2, 3, 1, MAL_RECOMPUTE_SELECTIVE),
                12.0 + 1.0 + 1.0 + 1.0, 1e-12, 0);
    /* caps in 9 MB at stage 0 of 4: (9 - 1.5) / 5 = 1 layer; selective
     * (9 - 2) / 3 = 2; full (9 - 2.375) / 1.5 = 4 */
    CHECK_EQ_INT(mal_cost_layer_cap_mode(&p, 9, 2, 4, 0, 1, MAL_RECOMPUTE_NONE), 1);
    CHECK_EQ_INT(mal_cost_layer_cap(&p, 9, 2, 4, 0), 1);
    CHECK_EQ_INT(mal_cost_layer_cap_mode(&p, 9, 2, 4, 0, 1, MAL_RECOMPUTE_SELECTIVE), 2);
    CHECK_EQ_INT(mal_cost_layer_cap_mode(&p, 9, 2, 4, 0, 1, MAL_RECOMPUTE_FULL), 4);
    /* time: the mode's share added */
    CHECK_CLOSE(mal_cost_recompute_time(&p, MAL_RECOMPUTE_NONE), 0.0, 0, 0);
    CHECK_CLOSE(mal_cost_recompute_time(&p, MAL_RECOMPUTE_SELECTIVE), 0.05, 0, 0);
    CHECK_CLOSE(mal_cost_recompute_time(&p, MAL_RECOMPUTE_FULL), 0.25, 0, 0);
    /* a profile built without the figures has the documented defaults */
    mal_profile q = {0};
    CHECK_CLOSE(mal_cost_acts_kept(&q, MAL_RECOMPUTE_FULL), MAL_REPLAN_KEPT_FULL, 0, 0);
    CHECK_CLOSE(mal_cost_recompute_time(&q, MAL_RECOMPUTE_FULL), MAL_REPLAN_TIME_FULL, 0, 0);
    mal_profile_fini(&p);
}

/* A uniform plan of one pipeline of 4 stages, 2 layers each, stage 0 full:
 * the cost model's period is 2 x 1.25, the simulator's stage 0 backward
 * carries the recomputation. */
static void check_eval_and_sim(void)
{
    mal_profile p;
    mal_cluster c;
    mal_plan plan;
    profile(&p, MAL_REPLAN_RECOMPUTE_AUTO);
    CHECK_OK(mal_cluster_regular(&c, 8, 8, 9));
    CHECK_OK(mal_plan_uniform(1, 2, 4, 8, 1, 1, &plan));
    plan.pipelines[0].micro_batches = 8;
    double rates[8] = {1, 1, 1, 1, 1, 1, 1, 1}, sim, sim0;
    mal_cost_eval ev;
    CHECK_OK(mal_cost_eval_plan(&plan, &p, &c, rates, &ev));
    CHECK(!ev.memory_ok); /* 11.5 MB on stage 0 without recomputation */
    CHECK_CLOSE(ev.step_time, 11 * 2.0, 1e-12, 0);
    mal_cost_eval_fini(&ev);
    CHECK_OK(mal_sim_plan(&plan, &p, rates, 8, 0.0, &sim0, NULL));
    plan.pipelines[0].stages[0].recompute = MAL_RECOMPUTE_FULL;
    CHECK_OK(mal_cost_eval_plan(&plan, &p, &c, rates, &ev));
    CHECK(ev.memory_ok); /* 5.375 MB */
    CHECK_CLOSE(ev.step_time, 11 * 2.5, 1e-12, 0);
    CHECK_OK(mal_sim_plan(&plan, &p, rates, 8, 0.0, &sim, NULL));
    /* the simulation: slower than without, within the shaped bound and
     * the closed form */
    CHECK(sim > sim0 * (1 + 1e-9));
    CHECK(sim >= ev.shaped * (1 - 1e-12) && sim <= ev.step_time * (1 + 1e-12));
    mal_cost_memory t;
    mal_cost_memory_terms(&p, &plan, 0, 0, &t);
    CHECK_EQ_INT(t.recompute, MAL_RECOMPUTE_FULL);
    CHECK_CLOSE(t.total, 5.375, 1e-12, 0);
    mal_cost_eval_fini(&ev);
    mal_plan_fini(&plan);
    mal_cluster_fini(&c);
    mal_profile_fini(&p);
}

static int plan_for(double mem, int recompute, mal_plan *plan, mal_replan_stats *st, mal_profile *p,
                    mal_cluster *c, const double *rates)
{
    profile(p, recompute);
    CHECK_OK(mal_cluster_regular(c, 8, 8, mem));
    mal_replan_input in = mal_test_replan_input(c, p, rates, 1, 8);
    in.search = MAL_REPLAN_EXHAUSTIVE;
    return mal_replan(&in, plan, st);
}

/* 8 ranks (four TP-2 groups), 8 layers, 8 micro-batches, 9 MB.  One
 * pipeline of 4 stages, 2 layers each, fits everywhere but on stage 0 (4
 * micro-batches in flight: 11.5 MB); selective there needs 8 MB and costs
 * 5 %: period 2.1, step 11 x 2.1 = 23.1 layer units.  Without
 * recomputation stage 0 holds one layer and another stage three: 11 x 3 =
 * 33.  Two pipelines of 2 stages need full recomputation on their first
 * stages (4 layers: 7.375 MB) and take 5 x 5 = 25.  The planner must find
 * 23.1 with selective on stage 0 alone; and whatever it picks, each stage
 * that recomputes must not fit its layers without, and the least mode that
 * fits is the one taken. */
static void check_forced(void)
{
    double rates[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    mal_profile p, p0;
    mal_cluster c, c0;
    mal_plan plan, none;
    mal_replan_stats st, st0;
    CHECK_OK(plan_for(9, MAL_REPLAN_RECOMPUTE_AUTO, &plan, &st, &p, &c, rates));
    CHECK_OK(plan_for(9, MAL_REPLAN_RECOMPUTE_NONE, &none, &st0, &p0, &c0, rates));
    int n_rc = 0;
    for (int i = 0; i < plan.n_pipelines; i++) {
        const mal_plan_pipeline *pl = &plan.pipelines[i];
        for (int j = 0; j < pl->n_stages; j++) {
            const mal_plan_stage *s = &pl->stages[j];
            int l = s->layer_end - s->layer_begin, d = mal_plan_stage_warmup(pl, j);
            printf("pipeline %d stage %d of %d: %d layers, recompute %s\n", i, j, pl->n_stages, l,
                   mal_recompute_name(s->recompute));
            /* fits in its mode, not in any faster one */
            CHECK(mal_cost_stage_need(&p, s->n_ranks, pl->n_stages, j, l, d, plan.n_pipelines,
                                      s->recompute) <= 9 * (1 + 1e-12));
            for (int m = MAL_RECOMPUTE_NONE; m < s->recompute; m++)
                CHECK(mal_cost_stage_need(&p, s->n_ranks, pl->n_stages, j, l, d, plan.n_pipelines,
                                          m) > 9);
            n_rc += s->recompute != MAL_RECOMPUTE_NONE;
        }
    }
    CHECK_EQ_INT(n_rc, 1);
    CHECK_EQ_INT(plan.n_pipelines, 1);
    CHECK_EQ_INT(plan.pipelines[0].stages[0].recompute, MAL_RECOMPUTE_SELECTIVE);
    CHECK_CLOSE(st.objective, 23.1, 1e-12, 0);
    CHECK_CLOSE(st0.objective, 33.0, 1e-12, 0);
    printf("with recomputation %.4f, without %.4f (layer units)\n", st.objective, st0.objective);
    CHECK(st.objective < st0.objective * (1 - 1e-9));
    /* the cost model and the simulator agree with the search */
    mal_cost_eval ev;
    double sim;
    CHECK_OK(mal_cost_eval_plan(&plan, &p, &c, rates, &ev));
    CHECK(ev.memory_ok);
    CHECK_CLOSE(ev.step_time, st.objective, 1e-12, 0);
    CHECK_OK(mal_sim_plan(&plan, &p, rates, 8, 0.0, &sim, NULL));
    CHECK(sim >= ev.shaped * (1 - 1e-12) && sim <= ev.step_time * (1 + 1e-12));
    CHECK_CLOSE(plan.predicted_step_time, st.objective * p.layer_time, 1e-9, 0);
    mal_cost_eval_fini(&ev);
    mal_plan_fini(&plan);
    mal_plan_fini(&none);
    mal_cluster_fini(&c);
    mal_cluster_fini(&c0);
    mal_profile_fini(&p);
    mal_profile_fini(&p0);

    /* ample memory: no stage recomputes, the plan is the one without */
    CHECK_OK(plan_for(1000, MAL_REPLAN_RECOMPUTE_AUTO, &plan, &st, &p, &c, rates));
    CHECK_OK(plan_for(1000, MAL_REPLAN_RECOMPUTE_NONE, &none, &st0, &p0, &c0, rates));
    CHECK_CLOSE(st.objective, st0.objective, 1e-12, 0);
    CHECK_EQ_INT(plan.n_pipelines, none.n_pipelines);
    for (int i = 0; i < plan.n_pipelines; i++)
        for (int j = 0; j < plan.pipelines[i].n_stages; j++)
            CHECK_EQ_INT(plan.pipelines[i].stages[j].recompute, MAL_RECOMPUTE_NONE);
    mal_plan_fini(&plan);
    mal_plan_fini(&none);
    mal_cluster_fini(&c);
    mal_cluster_fini(&c0);
    mal_profile_fini(&p);
    mal_profile_fini(&p0);

    /* --recompute full: every stage full */
    CHECK_OK(plan_for(1000, MAL_REPLAN_RECOMPUTE_FULL, &plan, &st, &p, &c, rates));
    for (int i = 0; i < plan.n_pipelines; i++)
        for (int j = 0; j < plan.pipelines[i].n_stages; j++)
            CHECK_EQ_INT(plan.pipelines[i].stages[j].recompute, MAL_RECOMPUTE_FULL);
    mal_plan_fini(&plan);
    mal_cluster_fini(&c);
    mal_profile_fini(&p);
}

/* The replica-count passes (README "Recomputation", the caps' memory
 * terms): 8 ranks, four TP-2 groups, 8 layers, 8 micro-batches, 17.5 MB,
 * each layer's state 2 MB (1 MB a rank) with --zero 1.  Four one-stage
 * pipelines (8 layers each) take (2 + 0) x 8 = 16 layer units and need
 * 16 + E 1 + X 1 = 18 MB with one replica (the first pass's dearest
 * count), but with four replicas the gradient copy (2 MB) and the moments
 * not kept (3 MB) make it 17: only a later pass finds them.  The first
 * pass's best, two pipelines of two stages (5 x 4 = 20), holds fewer layers
 * per stage than its caps (5 and 8) allow: a pass skipped because no stage
 * of the best plan is at its cap would miss the plan. */
static void check_replica_passes(void)
{
    double rates[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    mal_profile p;
    mal_cluster c;
    mal_plan plan;
    mal_replan_stats st;
    profile(&p, MAL_REPLAN_RECOMPUTE_NONE);
    p.layer_state_mb = 2.0;
    p.zero = 1;
    CHECK_CLOSE(mal_cost_stage_need(&p, 2, 1, 0, 8, 0, 0, MAL_RECOMPUTE_NONE), 18.0, 1e-12, 0);
    CHECK_CLOSE(mal_cost_stage_need(&p, 2, 1, 0, 8, 0, 4, MAL_RECOMPUTE_NONE), 17.0, 1e-12, 0);
    CHECK_EQ_INT(mal_cost_layer_cap_mode(&p, 17.5, 2, 2, 0, 0, MAL_RECOMPUTE_NONE), 5);
    CHECK_EQ_INT(mal_cost_layer_cap_mode(&p, 17.5, 2, 2, 1, 0, MAL_RECOMPUTE_NONE), 8);
    CHECK_OK(mal_cluster_regular(&c, 8, 8, 17.5));
    mal_replan_input in = mal_test_replan_input(&c, &p, rates, 1, 8);
    in.search = MAL_REPLAN_EXHAUSTIVE;
    CHECK_OK(mal_replan(&in, &plan, &st));
    printf("replica passes: %d pipelines, step %.4f layer units\n", plan.n_pipelines, st.objective);
    CHECK_EQ_INT(plan.n_pipelines, 4);
    CHECK_CLOSE(st.objective, 16.0, 1e-12, 0);
    mal_cost_eval ev;
    CHECK_OK(mal_cost_eval_plan(&plan, &p, &c, rates, &ev));
    CHECK(ev.memory_ok);
    mal_cost_eval_fini(&ev);
    mal_plan_fini(&plan);
    mal_cluster_fini(&c);
    mal_profile_fini(&p);
}

/* The sharded master (--zero-master on) in a stage's memory: where the
 * state holds a working copy apart (state_bytes 18: bf16), the master's
 * 4 of 18 bytes not kept beside the moments' 8 -- 8 layers of 2 MB at TP
 * 2 over four replicas: moments 8/18 x 8 MB x 3/4 = 2.67 MB shed, the
 * master 4/18 x 6 = 1.33 MB more; with no working copy (16 bytes) the
 * master is the working weights and nothing more is shed. */
static void check_zero_master(void)
{
    mal_profile p;
    mal_cost_memory t0, t1;
    profile(&p, MAL_REPLAN_RECOMPUTE_NONE);
    p.layer_state_mb = 2.0;
    p.state_bytes = 18.0;
    p.zero = 1;
    mal_cost_stage_terms(&p, 2, 1, 0, 8, 0, 4, MAL_RECOMPUTE_NONE, &t0);
    p.zero_master = 1;
    mal_cost_stage_terms(&p, 2, 1, 0, 8, 0, 4, MAL_RECOMPUTE_NONE, &t1);
    CHECK_CLOSE(t0.zero_saved, 8.0 / 18.0 * 6.0, 1e-12, 0);
    CHECK_CLOSE(t1.zero_saved, 12.0 / 18.0 * 6.0, 1e-12, 0);
    CHECK_CLOSE(t0.total - t1.total, 4.0 / 18.0 * 6.0, 1e-12, 0);
    printf("zero master: a stage of 8 layers over 4 replicas needs %.3f -> %.3f MB (bf16)\n",
           t0.total, t1.total);
    p.state_bytes = 16.0;
    mal_cost_stage_terms(&p, 2, 1, 0, 8, 0, 4, MAL_RECOMPUTE_NONE, &t1);
    CHECK_CLOSE(t1.zero_saved, 8.0 / 16.0 * 6.0, 1e-12, 0);
    mal_profile_fini(&p);
}

/* The bf16 runtime's state re-counted on a preset (18 bytes per parameter
 * where the preset counts 16): the layer's and the embedding's state
 * equal 18 bytes of the runtime's own parameter count (mal_model_layout),
 * the state inside k[d] and E grows by 2 bytes a parameter of the rank's
 * share while the activations (k[d + 1] - k[d]) stay; back to 16 restores
 * the preset; a profile file {"preset": ..., "state_bytes": 18} is the
 * same (the file's own figures kept); a k[d] that is not state +
 * activations x (d + 1), and a count below the gradient and moments' 12
 * bytes, are refused. */
static void check_state_bytes(void)
{
    static const char *const names[] = {"tiny", "tiny-llama3", "70b"};
    const double MB = 1048576.0;
    for (size_t i = 0; i < MAL_ARRAY_SIZE(names); i++) {
        mal_profile p, q;
        mal_model_config cfg;
        mal_tensor_info *t;
        int nt;
        size_t n_layer, n_embed;
        CHECK_OK(mal_profile_preset(&p, names[i], 1));
        CHECK_OK(mal_profile_preset(&q, names[i], 1));
        CHECK_OK(mal_config_load(&cfg, names[i]));
        mal_model_part layer = {0, 1, 0, 0, 1, 0}, embed = {0, 0, 1, 0, 1, 0};
        CHECK_OK(mal_model_layout(&cfg, &layer, &t, &nt, &n_layer));
        free(t);
        CHECK_OK(mal_model_layout(&cfg, &embed, &t, &nt, &n_embed));
        free(t);
        CHECK_OK(mal_profile_set_state_bytes(&q, 18.0));
        CHECK_CLOSE(q.state_bytes, 18.0, 0, 0);
        CHECK_CLOSE(q.layer_state_mb, 18.0 * (double)n_layer / MB, 1e-12, 0);
        CHECK_CLOSE(q.embed_state_mb, 18.0 * (double)n_embed / MB, 1e-12, 0);
        const double s16 = 2 * p.k[0] - p.k[1], s18 = 2 * q.k[0] - q.k[1];
        CHECK_CLOSE(s18, s16 * 18.0 / 16.0, 1e-9, 0);
        for (int d = 1; d < q.n_k; d++)
            CHECK_CLOSE(q.k[d] - q.k[d - 1], p.k[d] - p.k[d - 1], 1e-9, 1e-12);
        CHECK_CLOSE(q.embed_mb - p.embed_mb, 2.0 * (double)n_embed / p.tp / MB, 1e-9, 0);
        printf("state bytes: %s, 16 -> 18: layer %.4f -> %.4f MB, k[0] %.4f -> %.4f MB, E %.4f -> "
               "%.4f MB\n",
               names[i], p.layer_state_mb, q.layer_state_mb, p.k[0], q.k[0], p.embed_mb,
               q.embed_mb);
        /* a profile file of the preset with its state_bytes: the same
         * figures; its own figures stay as the file gives them */
        char js[128];
        mal_profile r;
        snprintf(js, sizeof js, "{\"preset\": \"%s\", \"state_bytes\": 18}", names[i]);
        CHECK_OK(mal_profile_parse_string(&r, js, "prof.json", 1));
        CHECK_CLOSE(r.layer_state_mb, q.layer_state_mb, 1e-12, 0);
        CHECK_CLOSE(r.k[7], q.k[7], 1e-12, 0);
        CHECK_CLOSE(r.embed_mb, q.embed_mb, 1e-12, 0);
        mal_profile_fini(&r);
        snprintf(js, sizeof js, "{\"preset\": \"%s\", \"state_bytes\": 18, \"layer_state_mb\": 5}",
                 names[i]);
        CHECK_OK(mal_profile_parse_string(&r, js, "prof.json", 1));
        CHECK_CLOSE(r.layer_state_mb, 5.0, 0, 0);
        CHECK_CLOSE(r.k[0], q.k[0], 1e-12, 0);
        mal_profile_fini(&r);
        snprintf(js, sizeof js, "{\"preset\": \"%s\", \"state_bytes\": 2}", names[i]);
        CHECK(mal_profile_parse_string(&r, js, "prof.json", 1) == MAL_EINVAL);
        CHECK(strstr(mal_errmsg(), "prof.json: state_bytes 2 with a preset") != NULL);
        mal_profile_fini(&r);
        CHECK_OK(mal_profile_set_state_bytes(&q, 16.0));
        CHECK_CLOSE(q.layer_state_mb, p.layer_state_mb, 1e-12, 0);
        CHECK_CLOSE(q.embed_mb, p.embed_mb, 1e-12, 0);
        CHECK_CLOSE(q.k[5], p.k[5], 1e-12, 0);
        CHECK(mal_profile_set_state_bytes(&q, 8.0) == MAL_EINVAL);
        q.k[3] += 1.0;
        CHECK(mal_profile_set_state_bytes(&q, 18.0) == MAL_EINVAL);
        CHECK(strstr(mal_errmsg(), "layer_memory_mb[3]") != NULL);
        CHECK_CLOSE(q.layer_state_mb, p.layer_state_mb, 1e-12, 0); /* unchanged */
        mal_profile_fini(&p);
        mal_profile_fini(&q);
    }
}

/* The replica counts the search tries with the master sharded: two
 * replicas shed 12 of the 18 bytes' halves (6) against the gradient
 * copy's 4, so two pipelines can fit where one does not -- which the
 * passes without the master (at least 3 replicas: 8 bytes' halves only
 * pay for the copy) never try.  110B on 64 ranks in the bf16 runtime's
 * memory, node 0's 8 ranks at 4x: the plan the reference figures give
 * (two pipelines of four stages) fits that memory, so the search must
 * find one at least as fast (before two replicas were tried it returned
 * one pipeline of seven stages, 7.7 % slower). */
static void check_zero_master_search(void)
{
    double rates[64];
    for (int r = 0; r < 64; r++)
        rates[r] = r < 8 ? 4.0 : 1.0;
    mal_profile ref, rt;
    mal_cluster c;
    mal_plan a, b;
    mal_replan_stats sa, sb;
    CHECK_OK(mal_profile_preset(&ref, "110b", 1));
    CHECK_OK(mal_profile_preset(&rt, "110b", 1));
    CHECK_OK(mal_cluster_regular(&c, 64, 8, 81920.0));
    ref.layer_state_mb = ref.embed_state_mb = ref.activation_bytes = 0; /* the state whole */
    CHECK_OK(mal_profile_set_state_bytes(&rt, 18.0));
    rt.zero = rt.zero_master = 1;
    rt.recompute = MAL_REPLAN_RECOMPUTE_AUTO;
    mal_replan_input in = mal_test_replan_input(&c, &ref, rates, 1, 64);
    in.nominal_dp = 2;
    CHECK_OK(mal_replan(&in, &a, &sa));
    mal_cost_eval ev;
    CHECK_OK(mal_cost_eval_plan(&a, &rt, &c, rates, &ev));
    CHECK(ev.memory_ok);
    mal_cost_eval_fini(&ev);
    in.profile = &rt;
    CHECK_OK(mal_replan(&in, &b, &sb));
    printf("zero master search: the reference's plan %d pipelines, %.3f s; the runtime's %d "
           "pipelines, %.3f s\n",
           a.n_pipelines, sa.objective * rt.layer_time, b.n_pipelines,
           sb.objective * rt.layer_time);
    CHECK(sb.objective <= sa.objective * (1 + 1e-9));
    CHECK_EQ_INT(b.n_pipelines, 2);
    mal_plan_fini(&a);
    mal_plan_fini(&b);
    mal_cluster_fini(&c);
    mal_profile_fini(&ref);
    mal_profile_fini(&rt);
}

/* Nothing fits even with full recomputation: refused naming the stage, its
 * need and the limit; without recomputation allowed the message says so. */
static void check_refusal(void)
{
    double rates[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    mal_profile p;
    mal_cluster c;
    mal_plan plan;
    mal_replan_stats st;
    CHECK(plan_for(3, MAL_REPLAN_RECOMPUTE_AUTO, &plan, &st, &p, &c, rates) == MAL_EINVAL);
    printf("refusal: %s\n", mal_errmsg());
    CHECK(strstr(mal_errmsg(), "memory_mb = 3") != NULL);
    CHECK(strstr(mal_errmsg(), "(recompute full)") != NULL);
    CHECK(strstr(mal_errmsg(), "on stage 0 of 4") != NULL);
    /* 2 layers at (1 + 0.125 x 4) + workspace 0.875 + E 0.5 + X 1 */
    CHECK(strstr(mal_errmsg(), "need 5.4 MB") != NULL);
    mal_clearerr();
    mal_cluster_fini(&c);
    mal_profile_fini(&p);
    /* 6 MB: enough with recomputation, not without (stage 0 of any
     * pipeline deeper than one holds no layer; one stage holds 2) */
    CHECK(plan_for(6, MAL_REPLAN_RECOMPUTE_NONE, &plan, &st, &p, &c, rates) == MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "(recompute none)") != NULL);
    CHECK(strstr(mal_errmsg(), "--recompute auto") != NULL);
    mal_clearerr();
    mal_cluster_fini(&c);
    mal_profile_fini(&p);
    CHECK_OK(plan_for(6, MAL_REPLAN_RECOMPUTE_AUTO, &plan, &st, &p, &c, rates));
    mal_plan_fini(&plan);
    mal_cluster_fini(&c);
    mal_profile_fini(&p);
}

/* The search's caps count what --explain counts (the pipeline's buffers,
 * the gradient sum's copy, the moments --zero 1 sheds): every stage of the
 * plan it writes fits by mal_cost_memory_terms.  small on 8 ranks in 200
 * MB with --zero 0: two pipelines of two stages fit by the per-layer
 * figures alone (197.0 and 205.5 MB with the gradient sum's copy). */
static void check_plan_terms_fit(void)
{
    for (int zero = 0; zero <= 1; zero++) {
        mal_profile p;
        mal_cluster c;
        mal_plan plan;
        mal_replan_stats st;
        double rates[8] = {1, 1, 1, 1, 1, 1, 1, 1};
        CHECK_OK(mal_profile_preset(&p, "small", 1));
        p.zero = zero;
        CHECK_OK(mal_cluster_regular(&c, 8, 8, 200));
        mal_replan_input in = mal_test_replan_input(&c, &p, rates, 1, 8);
        CHECK_OK(mal_replan(&in, &plan, &st));
        double most = 0;
        for (int i = 0; i < plan.n_pipelines; i++)
            for (int j = 0; j < plan.pipelines[i].n_stages; j++) {
                mal_cost_memory t;
                mal_cost_memory_terms(&p, &plan, i, j, &t);
                most = fmax(most, t.total);
            }
        printf("small, 200 MB, --zero %d: %d pipelines of %d stages, most %.1f MB\n", zero,
               plan.n_pipelines, plan.pipelines[0].n_stages, most);
        CHECK(most <= 200);
        mal_cost_eval ev;
        CHECK_OK(mal_cost_eval_plan(&plan, &p, &c, rates, &ev));
        CHECK(ev.memory_ok);
        mal_cost_eval_fini(&ev);
        mal_plan_fini(&plan);
        mal_cluster_fini(&c);
        mal_profile_fini(&p);
    }
}

int main(void)
{
    check_plan_terms_fit();
    check_hand_figures();
    check_eval_and_sim();
    check_forced();
    check_refusal();
    check_replica_passes();
    check_zero_master();
    check_state_bytes();
    check_zero_master_search();
    printf("test_replan_recompute: ok\n");
    return 0;
}
