/* Resharding between plans keeps the state bit for bit and the loss curve
 * (DESIGN.md's invariant), and sharded snapshots resume exactly.
 *
 * Run under mpiexec with 8 ranks (plans for fewer ranks use the first ones):
 *
 *   test_reshard [--model NAME] DIR SRC.json DST.json [DST.json ...]
 *     (Blocks of at least 2 KiB: replicas share the writing even for tiny.)
 *     Train `tiny` (or NAME: tiny-llama3 has key/value heads replicated
 *     and split, a tied embedding on two stages and a vocabulary the TP
 *     sizes do not divide) 6 steps on SRC with a sharded snapshot after step 3 (the
 *     uninterrupted reference).  Resume that snapshot on SRC: steps 4-6
 *     must repeat the reference bit for bit.  For each DST: reshard the
 *     snapshot (all 8 processes share the work), compare every tensor of
 *     the state read back whole from both snapshots (bit for bit), resume
 *     on DST, check every local shard the trainer loaded against the
 *     source snapshot (bit for bit), train steps 4-6 and compare the losses
 *     with the reference (1e-4 relative).
 *
 *   test_reshard --corrupt DIR PLAN.json
 *     Snapshot on PLAN, flip one byte inside a block of rank 1's shard
 *     file: resuming fails on every rank with the file and tensor named and
 *     no trainer is created; resharding it fails and commits nothing.
 *
 *   test_reshard --h5py-demo DIR PLAN.json
 *     Train 2 steps on PLAN, snapshot into DIR/snap, and dump every
 *     parameter and Adam-v shard each rank holds into DIR/held (raw float32
 *     plus a manifest) for tests/test_reshard_h5py.sh to compare with what
 *     h5py reads through the index's virtual datasets.
 *
 * Rank 0 prints one verdict line per check. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>

#include "ckpt/reshard.h"
#include "ckpt/snapshot.h"
#include "comm/comm.h"
#include "mal_test.h"
#include "src/model.h"
#include "src/plan.h"
#include "tiny_options.h"
#include "train/train.h"

enum { STEPS = 6, SNAP_AT = 3 };

static mal_comm *world;
static const char *model = "tiny";

static mal_train_options options(void)
{
    mal_train_options o = mal_test_tiny_options(STEPS, 2);
    CHECK_OK(mal_config_load(&o.model, model));
    o.optim.total_steps = STEPS; /* the same schedule in every run */
    /* whole moments on every rank: the checks read each rank's loaded
     * state, moments included, tensor by tensor (the sharded optimizer's
     * snapshots, resume and reshard: test_zero.sh) */
    o.zero = 0;
    return o;
}

/* The ranks a plan uses: the first `n` of the world, in a communicator
 * (NULL on the others). */
static mal_comm *plan_comm(const mal_plan *plan)
{
    int n = mal_plan_world_size(plan);
    CHECK(n <= world->size);
    mal_comm *c = NULL;
    CHECK_OK(mal_comm_split(world, world->rank < n ? 0 : -1, world->rank, &c));
    return c;
}

static void read_plan(mal_plan *p, const char *path)
{
    mal_plan_init(p);
    CHECK_OK(mal_plan_read(p, path));
}

static void join(char *out, const char *a, const char *b)
{
    CHECK(snprintf(out, 4096, "%s/%s", a, b) < 4096);
}

/* Train `steps` steps on `plan` (its ranks only), optionally resuming from
 * `dir`, saving after step SNAP_AT when `save` is set; losses of steps
 * first+1 .. steps land in loss[]. */
static void train(const mal_plan *plan, const char *dir, int resume, int save, int64_t steps,
                  double *loss)
{
    mal_comm *c = plan_comm(plan);
    if (c) {
        mal_train_options o = options();
        o.plan = plan;
        o.world = c;
        o.snapshot_dir = dir;
        o.resume = resume;
        mal_trainer *tr;
        CHECK_OK(mal_trainer_create(&tr, &o));
        for (int64_t s = mal_trainer_steps_done(tr); s < steps; s++) {
            mal_step_stats st;
            CHECK_OK(mal_trainer_step(tr, &st));
            loss[s] = st.loss;
            if (save && s + 1 == SNAP_AT) CHECK_OK(mal_trainer_save(tr));
        }
        mal_trainer_destroy(tr);
        mal_comm_destroy(c);
    }
    /* everyone learns the losses (ranks outside the plan too) */
    double buf[STEPS];
    for (int s = 0; s < STEPS; s++)
        buf[s] = world->rank == 0 ? loss[s] : 0;
    CHECK_OK(mal_comm_broadcast(world, buf, sizeof buf, 0));
    memcpy(loss, buf, sizeof buf);
}

/* Every tensor of snapshots a and b, read whole, bit for bit; the tensors
 * are shared out among the ranks.  Meta must agree but for the plan. */
static void compare_snapshots(const char *a_dir, const char *b_dir, const char *b_plan_json)
{
    mal_snapshot *a, *b;
    CHECK_OK(mal_snapshot_open(&a, a_dir));
    CHECK_OK(mal_snapshot_open(&b, b_dir));
    const mal_snap_meta *ma = mal_snapshot_meta(a), *mb = mal_snapshot_meta(b);
    CHECK_EQ_INT(ma->step, mb->step);
    CHECK_EQ_INT(ma->consumed_samples, mb->consumed_samples);
    CHECK(ma->seed == mb->seed && ma->rng_counter == mb->rng_counter);
    CHECK(!strcmp(ma->config_json, mb->config_json) && !strcmp(ma->train_json, mb->train_json));
    CHECK(mb->plan_json && !strcmp(mb->plan_json, b_plan_json));
    CHECK_EQ_INT(mal_snapshot_n_tensors(a), mal_snapshot_n_tensors(b));
    int n = mal_snapshot_n_tensors(a), bad = 0;
    for (int i = world->rank; i < n; i += world->size) {
        mal_snap_tensor ia, ib;
        CHECK_OK(mal_snapshot_tensor_info(a, i, &ia));
        CHECK_OK(mal_snapshot_tensor_info(b, i, &ib));
        CHECK(!strcmp(ia.name, ib.name) && ia.ndim == ib.ndim);
        size_t c = 1;
        for (int d = 0; d < ia.ndim; d++)
            c *= (size_t)ia.shape[d];
        float *x = malloc(c * sizeof(float)), *y = malloc(c * sizeof(float));
        CHECK(x && y);
        CHECK_OK(mal_snapshot_read(a, ia.name, ia.ndim, ia.shape, x, c));
        CHECK_OK(mal_snapshot_read(b, ib.name, ib.ndim, ib.shape, y, c));
        if (memcmp(x, y, c * sizeof(float))) {
            fprintf(stderr, "tensor %s differs after the reshard\n", ia.name);
            bad = 1;
        }
        free(x);
        free(y);
    }
    double e = bad;
    CHECK_OK(mal_comm_allreduce_max_f64(world, &e, 1));
    CHECK(e == 0);
    mal_snapshot_close(a);
    mal_snapshot_close(b);
}

/* After a resume: every local shard of every state group equals the
 * snapshot's block (bit for bit).  Returns the number of floats checked. */
static size_t check_loaded(mal_trainer *tr, const char *step_dir)
{
    mal_model *m = mal_trainer_model(tr);
    if (!m) return 0;
    mal_snapshot *s;
    CHECK_OK(mal_snapshot_open(&s, step_dir));
    float *buf = malloc(m->n_params * sizeof(float) + 4), *held = malloc(m->n_params * 4 + 4);
    CHECK(buf && held);
    size_t checked = 0;
    for (int g = 0; g < MAL_STATE_N_SAVED; g++)
        for (int i = 0; i < m->n_tensors; i++) {
            const mal_tensor_info *t = &m->tensors[i];
            char name[96];
            snprintf(name, sizeof name, "%s/%s", mal_model_state_name(g), t->name);
            mal_snap_tensor w = {.name = name, .ndim = t->ndim, .data = buf};
            for (int d = 0; d < t->ndim; d++) {
                w.shape[d] = t->shape[d];
                w.offset[d] = d == t->split_dim ? t->split_off : 0;
                w.extent[d] = t->local_shape[d];
            }
            CHECK_OK(mal_snapshot_read_block(s, &w));
            /* the trainer's state through the kernel table (device memory) */
            CHECK_OK(mal_model_state_to_host(m, g, t, held));
            if (memcmp(buf, held, t->n * sizeof(float))) {
                fprintf(stderr, "rank %d: loaded %s differs from the snapshot\n", world->rank,
                        name);
                exit(1);
            }
            checked += t->n;
        }
    free(buf);
    free(held);
    mal_snapshot_close(s);
    return checked;
}

static int run_pairs(const char *dir, const char *src_path, int n_dst, char **dst_paths)
{
    mal_plan src;
    read_plan(&src, src_path);
    char snap_a[4096], step3[4096], name[64];
    join(snap_a, dir, "src");
    snprintf(name, sizeof name, "step_%08d", SNAP_AT);
    join(step3, snap_a, name);
    double ref[STEPS] = {0}, again[STEPS] = {0};
    double t0 = mal_now();
    train(&src, snap_a, 0, 1, STEPS, ref);
    /* the same plan continues bit for bit */
    train(&src, snap_a, 1, 0, STEPS, again);
    int same = 1;
    for (int s = SNAP_AT; s < STEPS; s++)
        same &= again[s] == ref[s];
    if (world->rank == 0)
        printf("%s resume on %s: steps %d-%d %s the uninterrupted run (%.2f s)\n",
               same ? "PASS" : "FAIL", src_path, SNAP_AT + 1, STEPS,
               same ? "repeat bit for bit" : "DIFFER from", mal_now() - t0);
    int failed = !same;

    for (int k = 0; k < n_dst; k++) {
        mal_plan dst;
        read_plan(&dst, dst_paths[k]);
        char out[4096], sub[64], *pj;
        snprintf(sub, sizeof sub, "dst%d", k);
        join(out, dir, sub);
        t0 = mal_now();
        /* tiny buffers, so that blocks go through in slabs: rows of 1 KiB,
         * and for one pair pieces of single rows */
        mal_reshard_options ro = {
            .src = step3, .dst_dir = out, .plan = &dst, .mem_bytes = k == 1 ? 128 : 1024};
        mal_reshard_stats st;
        CHECK_OK(mal_reshard(world, &ro, &st));
        CHECK(st.bytes_written > 0 && st.bytes_read >= st.bytes_written);
        double t_reshard = mal_now() - t0;
        CHECK_OK(mal_plan_to_string(&dst, &pj));
        compare_snapshots(step3, st.out_path, pj);
        free(pj);

        /* resume on the new plan: the loaded shards, then the curve */
        mal_comm *c = plan_comm(&dst);
        double loss[STEPS] = {0}, n_checked = 0;
        if (c) {
            mal_train_options o = options();
            o.plan = &dst;
            o.world = c;
            o.snapshot_dir = out;
            o.resume = 1;
            mal_trainer *tr;
            CHECK_OK(mal_trainer_create(&tr, &o));
            CHECK_EQ_INT(mal_trainer_steps_done(tr), SNAP_AT);
            n_checked = (double)check_loaded(tr, st.out_path);
            for (int s = SNAP_AT; s < STEPS; s++) {
                mal_step_stats ss;
                CHECK_OK(mal_trainer_step(tr, &ss));
                loss[s] = ss.loss;
            }
            mal_trainer_destroy(tr);
            mal_comm_destroy(c);
        }
        CHECK_OK(mal_comm_allreduce_f64(world, &n_checked, 1));
        CHECK_OK(mal_comm_broadcast(world, loss, sizeof loss, 0));
        double worst = 0;
        for (int s = SNAP_AT; s < STEPS; s++)
            worst = fmax(worst, fabs(loss[s] - ref[s]) / fabs(ref[s]));
        int ok = worst <= 1e-4 && n_checked > 0;
        failed |= !ok;
        if (world->rank == 0)
            printf("%s %s -> %s: %d tensors bit-exact (%.0f KiB, %d shard files, reshard %.2f s), "
                   "%.0f loaded floats match, steps %d-%d max loss rel diff %.2e\n",
                   ok ? "PASS" : "FAIL", src_path, dst_paths[k], st.n_tensors,
                   (double)st.bytes_written / 1024, st.n_shards, t_reshard, n_checked, SNAP_AT + 1,
                   STEPS, worst);
        mal_plan_fini(&dst);
    }
    mal_plan_fini(&src);
    return failed;
}

/* Flip one byte in the middle of the first block of `shard` and return
 * that block's tensor name. */
static void flip_byte(const char *step_dir, const char *shard, char *tensor, size_t len)
{
    mal_snapshot *s;
    CHECK_OK(mal_snapshot_open(&s, step_dir));
    int found = 0;
    for (int i = 0; i < mal_snapshot_n_tensors(s) && !found; i++)
        for (int k = 0; k < mal_snapshot_n_blocks(s, i) && !found; k++) {
            mal_snap_tensor b;
            const char *file;
            CHECK_OK(mal_snapshot_block_info(s, i, k, &b, &file));
            if (strcmp(file, shard)) continue;
            found = 1;
            snprintf(tensor, len, "%s", b.name);
            char path[4096], dname[1100];
            join(path, step_dir, shard);
            size_t n = (size_t)snprintf(dname, sizeof dname, "%s/block", b.name);
            for (int d = 0; d < b.ndim; d++)
                n += (size_t)snprintf(dname + n, sizeof dname - n, "_%lld", (long long)b.offset[d]);
            hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
            hid_t ds = H5Dopen2(f, dname, H5P_DEFAULT);
            CHECK(f >= 0 && ds >= 0);
            haddr_t a = H5Dget_offset(ds);
            hsize_t bytes = H5Dget_storage_size(ds);
            H5Dclose(ds);
            H5Fclose(f);
            int fd = open(path, O_RDWR);
            CHECK(fd >= 0);
            unsigned char c;
            off_t at = (off_t)(a + bytes / 2);
            CHECK(pread(fd, &c, 1, at) == 1);
            c ^= 0x01;
            CHECK(pwrite(fd, &c, 1, at) == 1);
            close(fd);
        }
    CHECK(found);
    mal_snapshot_close(s);
}

static int run_corrupt(const char *dir, const char *plan_path)
{
    mal_plan plan;
    read_plan(&plan, plan_path);
    CHECK(mal_plan_world_size(&plan) == world->size);
    char snap[4096], step[4096], tensor[256] = "";
    join(snap, dir, "snap");
    double loss[STEPS];
    mal_train_options o = options();
    o.plan = &plan;
    o.world = world;
    o.snapshot_dir = snap;
    mal_trainer *tr;
    CHECK_OK(mal_trainer_create(&tr, &o));
    for (int s = 0; s < SNAP_AT; s++)
        CHECK_OK(mal_trainer_step(tr, NULL));
    CHECK_OK(mal_trainer_save(tr));
    mal_trainer_destroy(tr);
    (void)loss;
    CHECK_OK(mal_snapshot_find_latest(snap, step, sizeof step));
    if (world->rank == 0) flip_byte(step, "shard_00001.h5", tensor, sizeof tensor);
    CHECK_OK(mal_comm_broadcast(world, tensor, sizeof tensor, 0));

    /* resume: refused on every rank, naming the file and the tensor */
    o.resume = 1;
    tr = NULL;
    int rc = mal_trainer_create(&tr, &o);
    char want[300];
    snprintf(want, sizeof want, "tensor '%s'", tensor);
    int ok = rc == MAL_ECORRUPT && tr == NULL && strstr(mal_errmsg(), "shard_00001.h5") &&
             strstr(mal_errmsg(), want);
    if (!ok) fprintf(stderr, "rank %d: resume gave %d: %s\n", world->rank, rc, mal_errmsg());
    double bad = !ok;
    if (world->rank == 0) printf("rank 0 says: %s\n", mal_errmsg());

    /* resharding it fails too, and commits nothing */
    char out[4096], latest[4096];
    join(out, dir, "resharded");
    mal_reshard_options ro = {.src = snap, .dst_dir = out, .plan = &plan};
    rc = mal_reshard(world, &ro, NULL);
    int ok2 = rc == MAL_ECORRUPT && strstr(mal_errmsg(), "shard_00001.h5") &&
              mal_snapshot_find_latest(out, latest, sizeof latest) == MAL_ENOENT;
    if (!ok2) fprintf(stderr, "rank %d: reshard gave %d: %s\n", world->rank, rc, mal_errmsg());
    bad += !ok2;
    CHECK_OK(mal_comm_allreduce_max_f64(world, &bad, 1));
    if (world->rank == 0)
        printf("%s corrupt byte in %s/shard_00001.h5 (%s): resume and reshard refused on all %d "
               "ranks\n",
               bad == 0 ? "PASS" : "FAIL", step, want, world->size);
    mal_plan_fini(&plan);
    return bad != 0;
}

static int run_h5py_demo(const char *dir, const char *plan_path)
{
    mal_plan plan;
    read_plan(&plan, plan_path);
    CHECK(mal_plan_world_size(&plan) == world->size);
    char snap[4096], held[4096];
    join(snap, dir, "snap");
    join(held, dir, "held");
    if (world->rank == 0) CHECK(mkdir(held, 0755) == 0 || errno == EEXIST);
    CHECK_OK(mal_comm_barrier(world));
    mal_train_options o = options();
    o.plan = &plan;
    o.world = world;
    o.snapshot_dir = snap;
    mal_trainer *tr;
    CHECK_OK(mal_trainer_create(&tr, &o));
    for (int s = 0; s < 2; s++)
        CHECK_OK(mal_trainer_step(tr, NULL));
    CHECK_OK(mal_trainer_save(tr));
    mal_model *m = mal_trainer_model(tr);
    if (m) {
        char man[4096], mname[64];
        snprintf(mname, sizeof mname, "manifest.%d.txt", world->rank);
        join(man, held, mname);
        FILE *mf = fopen(man, "w");
        CHECK(mf != NULL);
        const int groups[] = {MAL_STATE_PARAM, MAL_STATE_ADAM_V};
        float *host = malloc(m->n_params * sizeof(float) + 4);
        CHECK(host != NULL);
        for (int gi = 0; gi < 2; gi++)
            for (int i = 0; i < m->n_tensors; i++) {
                const mal_tensor_info *t = &m->tensors[i];
                const char *gname = mal_model_state_name(groups[gi]);
                char fname[256], path[4096];
                snprintf(fname, sizeof fname, "%s.%s.%d.bin", gname, t->name, world->rank);
                join(path, held, fname);
                CHECK_OK(mal_model_state_to_host(m, groups[gi], t, host));
                FILE *f = fopen(path, "wb");
                CHECK(f && fwrite(host, sizeof(float), t->n, f) == t->n);
                CHECK(fclose(f) == 0);
                int64_t off[2] = {0, 0}, ext[2] = {t->local_shape[0], 1};
                if (t->ndim == 2) ext[1] = t->local_shape[1];
                if (t->split_dim >= 0) off[t->split_dim] = t->split_off;
                fprintf(mf, "%s/%s %s %d %lld %lld %lld %lld\n", gname, t->name, fname, t->ndim,
                        (long long)off[0], (long long)off[1], (long long)ext[0], (long long)ext[1]);
            }
        free(host);
        CHECK(fclose(mf) == 0);
    }
    mal_trainer_destroy(tr);
    mal_plan_fini(&plan);
    return 0;
}

int main(int argc, char **argv)
{
    CHECK_OK(mal_comm_init(&argc, &argv, &world));
    mal_log_level = MAL_LOG_WARN;
    /* small enough that replicas share the writing of `tiny`'s matrices
     * (64 x 64 floats): blocks split across data-parallel replicas, in the
     * trainer's snapshots and in resharded ones */
    mal_reshard_min_block_bytes = 2048;
    int failed;
    if (argc >= 3 && !strcmp(argv[1], "--model")) {
        model = argv[2];
        argc -= 2;
        argv += 2;
    }
    if (argc == 4 && !strcmp(argv[1], "--corrupt"))
        failed = run_corrupt(argv[2], argv[3]);
    else if (argc == 4 && !strcmp(argv[1], "--h5py-demo"))
        failed = run_h5py_demo(argv[2], argv[3]);
    else if (argc >= 4 && argv[1][0] != '-')
        failed = run_pairs(argv[1], argv[2], argc - 3, argv + 3);
    else {
        if (world->rank == 0)
            fprintf(stderr, "usage: test_reshard DIR SRC.json DST.json... | --corrupt DIR PLAN | "
                            "--h5py-demo DIR PLAN\n");
        mal_comm_abort(world, MAL_TEST_ERROR);
        return MAL_TEST_ERROR;
    }
    mal_comm_finalize(world);
    return failed ? 1 : 0;
}
